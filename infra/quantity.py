"""Kubernetes resource quantities ("24", "500m", "200G", "16Gi") as numbers, for comparing a pod's
requests with what a machine has. Only the suffixes a CPU or memory request uses."""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}
PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"


def parse(text: str) -> Decimal:
    """The quantity's value in base units (cores, bytes). ValueError if it is not one."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti)?", str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as 24, 500m, 200G or 16Gi")
    return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]


def cpu(cores: Decimal | float) -> str:
    """Whole cores where exact, else millicores: "21", "21500m"."""
    millis = int(Decimal(cores) * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def memory(num_bytes: Decimal | int) -> str:
    """Whole GiB, rounded down: "36Gi"."""
    return f"{int(Decimal(num_bytes) // 2**30)}Gi"
