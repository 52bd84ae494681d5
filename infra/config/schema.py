"""The environment config's schema: pydantic models whose validators refuse, field by field, what
the platform or the catalog does not offer. Loading (YAML -> `Environment`) is `infra.config`;
the platform's rules over a whole environment are `infra.config.platform`. Each section has its
module: `network`, `slice_groups`, `ray`, `serving`, `kueue`; this one holds the environment itself
and re-exports the sections' names."""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationInfo, field_validator, model_validator

from infra.config.errors import ConfigError
from infra.config.fields import _BUCKET, _GKE_VERSION, _PROJECT, Name, Strict, Zone
from infra.config.kueue import KueueConfig
from infra.config.network import Network
from infra.config.ray import TPU_PYTHON, Peer, RayAccess, RayConfig, RayHead
from infra.config.serving import Serving
from infra.config.slice_groups import FLEX_CAPACITY, RESERVATION_HELP, Autoscaling, Capacity, CapacityKind, Reservation, SliceGroup

__all__ = [
    "FLEX_CAPACITY",
    "RESERVATION_HELP",
    "TPU_PYTHON",
    "Autoscaling",
    "BucketConfig",
    "Capacity",
    "CapacityKind",
    "CpuPool",
    "Environment",
    "KueueConfig",
    "Network",
    "Peer",
    "RayAccess",
    "RayConfig",
    "RayHead",
    "Reservation",
    "Serving",
    "SliceGroup",
]


class CpuPool(Strict):
    """The pool that runs the Ray head and system pods."""

    machine_type: str = "e2-standard-8"
    min_nodes: NonNegativeInt = 1
    max_nodes: PositiveInt = 3
    disk_size_gb: Annotated[int, Field(ge=20, le=65536)] = 100

    @model_validator(mode="after")
    def _min_le_max(self) -> CpuPool:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must not exceed max_nodes ({self.max_nodes})")
        return self


class BucketConfig(Strict):
    """The GCS bucket for checkpoints and data. The name defaults to `<project>-<cluster>-ray`."""

    name: Annotated[str, Field(pattern=_BUCKET)] | None = None
    location: str | None = None  # defaults to the region
    force_destroy: bool = False


class Environment(Strict):
    name: Name
    project: Annotated[str, Field(pattern=_PROJECT)]
    region: Annotated[str, Field(pattern=r"^[a-z]+-[a-z]+[0-9]+$")]
    zone: Zone
    cluster_name: Name
    mode: Literal["standard", "autopilot"] = "standard"
    # Standard only: a zonal cluster (the control plane in `zone`) or a regional one (the control
    # plane across the region). Either way each slice group's pools sit in the group's own zone of
    # the region (platform_facts.NODE_LOCATIONS); regional adds a control plane that survives a zone.
    cluster_type: Literal["zonal", "regional"] = "zonal"
    release_channel: Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"] = "REGULAR"
    # The oldest GKE version the cluster may start on (`min_master_version`); required where a
    # feature needs a newer one than every channel has (TPU7x, flex-start TPUs).
    gke_min_version: Annotated[str, Field(pattern=_GKE_VERSION)] | None = None
    deletion_protection: bool = True
    network: Network = Network()
    cpu_pool: CpuPool = CpuPool()
    slice_groups: Annotated[list[SliceGroup], Field(min_length=1)]
    ray: RayConfig = RayConfig()
    bucket: BucketConfig = BucketConfig()
    # A GCS bucket for Terraform state, shared by laptops and Cloud Build. None: local state.
    state_bucket: Annotated[str, Field(pattern=_BUCKET)] | None = None
    serving: Serving | None = None
    kueue: KueueConfig | None = None
    labels: dict[Annotated[str, Field(pattern=r"^[a-z][-_a-z0-9]{0,62}$")], Annotated[str, Field(pattern=r"^[-_a-z0-9]{0,63}$")]] = {}

    @field_validator("zone")
    @classmethod
    def _zone_in_region(cls, value: str, info: ValidationInfo) -> str:
        region = info.data.get("region")
        if region and not value.startswith(region + "-"):
            raise ValueError(f"zone {value!r} is not in region {region!r}: use {region}-a, {region}-b, ...")
        return value

    @field_validator("slice_groups")
    @classmethod
    def _unique_names(cls, groups: list[SliceGroup]) -> list[SliceGroup]:
        names = [g.name for g in groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"slice group names must be unique; repeated: {', '.join(dupes)}")
        return groups

    @model_validator(mode="after")
    def _serving_fits(self) -> Environment:
        if self.serving is None:
            return self
        names = [g.name for g in self.slice_groups]
        if self.serving.slice_group not in names:
            raise ValueError(f"serving.slice_group {self.serving.slice_group!r} is not a slice group; valid: {', '.join(names)}")
        bucket = self.serving.model_bucket
        if bucket and bucket != self.bucket_name:
            raise ValueError(f"serving.model {self.serving.model!r} must be in the environment's bucket gs://{self.bucket_name}/")
        return self

    @property
    def stack_name(self) -> str:
        return f"ray-tpu-{self.name}"

    @property
    def bucket_name(self) -> str:
        return self.bucket.name or f"{self.project}-{self.cluster_name}-ray"

    @property
    def bucket_location(self) -> str:
        return (self.bucket.location or self.region).upper()

    @property
    def location(self) -> str:
        """Where the cluster lives: the zone of a zonal Standard cluster, else the region."""
        return self.region if self.mode == "autopilot" or self.cluster_type == "regional" else self.zone

    def group_zone(self, group: SliceGroup) -> str:
        return group.zone or self.zone

    @cached_property
    def platform_findings(self) -> tuple[list[str], list[str]]:
        """(errors, warnings) of the platform rules, computed once per environment."""
        from infra.config.platform import platform_problems

        return platform_problems(self)

    @property
    def warnings(self) -> list[str]:
        """What the platform rules accepted only because the config said so, one line each."""
        return self.platform_findings[1]

    @property
    def cluster_queue_name(self) -> str | None:
        if self.kueue is None:
            return None
        return self.kueue.cluster_queue or f"{self.cluster_name}-tpu"

    @property
    def ray_cluster_name(self) -> str:
        return f"{self.cluster_name}-ray"

    def slice_group(self, name: str) -> SliceGroup:
        for group in self.slice_groups:
            if group.name == name:
                return group
        raise ConfigError(f"environment {self.name!r}", [f"no slice group {name!r}; valid: {', '.join(g.name for g in self.slice_groups)}"])
