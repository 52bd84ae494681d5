"""Kubernetes resource quantities ("24", "500m", "200G", "16Gi") as numbers, for comparing a pod's
requests with what a machine has, and numbers back as quantities for quotas: exact, or rounded up
(a quota rounded down admits less than it was sized for), never in exponent form.

Kubernetes' own canonical form (k8s.io/apimachinery pkg/api/resource/quantity.go `CanonicalizeBytes`)
keeps a quantity's suffix family; we write the shortest exact one of either family, so that
`2 x 300G` prints `600G` and `16Gi + 1Gi` prints `17Gi`."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal

_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
}
PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"
# Largest first: the first suffix that divides a value exactly gives the fewest digits in its family.
_WHOLE = ("Pi", "P", "Ti", "T", "Gi", "G", "Mi", "M", "Ki", "k")


# Kubernetes' whole quantity grammar (the CRDs' int-or-string pattern, apimachinery quantity.go):
# a signed decimal, then a binary or decimal suffix or a decimal exponent ("1e3"; "1E" alone is exa).
_GRAMMAR = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([KMGTPE]i|[numkMGTPE])|[eE]([+-]?[0-9]+))?")
_MORE = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "E": Decimal(10**18), "Ei": Decimal(2**60)}


def parse(text: str | int | float) -> Decimal:
    """The quantity's value in base units (cores, bytes): any form Kubernetes takes, a YAML number
    too. ValueError if it is not one."""
    match = _GRAMMAR.fullmatch(str(text).strip())
    if not match or isinstance(text, bool):
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as 24, 500m, 200G or 16Gi")
    number, suffix, exponent = match.groups()
    if exponent is not None:
        return Decimal(number).scaleb(int(exponent))
    return Decimal(number) * {**_SUFFIX, **_MORE}[suffix or ""]


def whole(value: Decimal, *, milli: bool) -> int:
    """apimachinery's `MilliValue` (ceil(value x 1000)) or `Value` (ceil(value)): the int64 Kueue
    and the scheduler compare (kueue pkg/resources/requests.go:142-151 ResourceValue)."""
    return int((value * 1000 if milli else value).to_integral_value(rounding=ROUND_CEILING))


def canonical(value: int, *, binary: bool) -> str:
    """A whole value as apimachinery's canonical form prints it: the largest suffix of its format
    (BinarySI: Ki..Ei; DecimalSI: k..E) that divides it exactly, else the plain integer; BinarySI
    under 1024 prints as DecimalSI (quantity.go CanonicalizeBytes)."""
    if binary and abs(value) >= 1024:
        steps, base = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1024
    else:
        steps, base = ("k", "M", "G", "T", "P", "E"), 1000
    suffix = ""
    for step in steps:
        if value == 0 or value % base:
            break
        value, suffix = value // base, step
    return f"{value}{suffix}"


def exact(value: Decimal | int) -> str:
    """`value` (base units) as the shortest quantity that equals it or, past a thousandth, exceeds
    it by less than a thousandth: "600G", "17Gi", "15", "21500m", "299573968897"."""
    milli = (Decimal(value) * 1000).to_integral_value(rounding=ROUND_CEILING)
    if milli < 0:
        raise ValueError(f"{value} is negative: a resource quantity is not")
    if milli % 1000:
        return f"{int(milli)}m"
    whole = int(milli // 1000)
    candidates = [f"{whole // int(_SUFFIX[s])}{s}" for s in _WHOLE if whole and whole % int(_SUFFIX[s]) == 0]
    return min([*candidates, str(whole)], key=len)


def cpu(cores: Decimal | float) -> str:
    """Whole cores where exact, else millicores rounded up: "21", "21500m"."""
    millis = (Decimal(cores) * 1000).to_integral_value(rounding=ROUND_CEILING)
    return str(int(millis) // 1000) if millis % 1000 == 0 else f"{int(millis)}m"


def memory(num_bytes: Decimal | int) -> str:
    """Bytes, exactly (rounded up to a whole byte): "600G", "36Gi", "299573968897"."""
    return exact(Decimal(num_bytes).to_integral_value(rounding=ROUND_CEILING))


def gib_at_most(num_bytes: Decimal | int) -> str:
    """Whole GiB, rounded down: "36Gi". For a request that must fit within `num_bytes` (never a quota)."""
    return f"{int(Decimal(num_bytes) // 2**30)}Gi"
