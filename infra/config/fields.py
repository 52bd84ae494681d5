"""The config's field types: names, zones, quantities, CIDRs and label keys as the platform writes
them, each with the sentence a user sees when a value does not match."""

from __future__ import annotations

from ipaddress import IPv4Network
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# GKE node pool and Kubernetes names: lowercase DNS labels. Node pool names are suffixed with the
# slice index ("-0"), so groups stay short enough for GKE's 40-character limit.
_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_PROJECT = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"
_BUCKET = r"^[a-z0-9][-_.a-z0-9]{1,61}[a-z0-9]$"
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"
_ZONE = r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$"  # us-east5-b, and AI zones such as us-central1-ai1a
_GKE_VERSION = r"^1\.[0-9]+(\.[0-9]+(-gke\.[0-9]+)?)?$"
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"

PATTERN_HELP = {
    _NAME: "lowercase letters, digits and hyphens, starting with a letter",
    _PROJECT: "a GCP project id (6-30 lowercase letters, digits and hyphens)",
    _BUCKET: "a GCS bucket name (3-63 lowercase letters, digits, '-', '_' and '.')",
    _QUANTITY: "a Kubernetes quantity such as 24, 500m, 200G or 16Gi",
    _ZONE: "a zone such as us-east5-b",
    _GKE_VERSION: "a GKE version such as 1.35 or 1.34.0-gke.2201000",
    _LABEL_KEY: "a Kubernetes label key such as app or example.com/role",
    _LABEL_VALUE: "a Kubernetes label value (at most 63 letters, digits, '-', '_' and '.')",
}

Name = Annotated[str, Field(pattern=_NAME, max_length=30)]


def _cidr_text(value: Any) -> Any:
    # ipaddress would take an int (or a bool) as an address: a CIDR must be written as one.
    if not isinstance(value, (str, IPv4Network)):
        raise ValueError(f"{value!r} is not a CIDR range; write it like 10.10.0.0/20")
    if isinstance(value, str):
        try:
            return IPv4Network(value)
        except ValueError as err:  # pydantic's own message says neither why nor what would do
            raise ValueError(f"{value!r} is not a CIDR range ({err}); write it like 10.10.0.0/20") from None
    return value


Cidr = Annotated[IPv4Network, BeforeValidator(_cidr_text)]
Quantity = Annotated[str, Field(pattern=_QUANTITY)]
Zone = Annotated[str, Field(pattern=_ZONE)]


class Strict(BaseModel):
    # Unknown keys are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


Image = Annotated[str, Field(min_length=1)]
LabelKey = Annotated[str, Field(pattern=_LABEL_KEY)]
LabelValue = Annotated[str, Field(pattern=_LABEL_VALUE)]
