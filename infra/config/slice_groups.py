"""The config's slice groups: identical TPU slices, their capacity (on-demand, spot, flex-start,
queued provisioning or a reservation), autoscaling and the requests of their Ray worker pods."""

from __future__ import annotations

import re
import typing
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationInfo, field_validator, model_validator

from infra import catalog, rules
from infra.config.fields import _PROJECT, Name, Quantity, Strict, Zone

# A reservation as Compute Engine's ReservationAffinity takes it: NAME in the cluster's project, or
# projects/OWNER/reservations/NAME when it is shared from another project, optionally down to a
# block (/reservationBlocks/BLOCK) and a sub-block (/reservationSubBlocks/SUB). Names are RFC 1035
# labels of 1-63 characters (platform_facts.SHARED_RESERVATIONS).
_RESERVATION_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_RESERVATION = re.compile(
    rf"^(?:projects/(?P<project>{_PROJECT[1:-1]})/reservations/)?(?P<name>{_RESERVATION_NAME})"
    rf"(?:/reservationBlocks/(?P<block>{_RESERVATION_NAME})(?:/reservationSubBlocks/(?P<sub_block>{_RESERVATION_NAME}))?)?$"
)
RESERVATION_HELP = (
    "NAME, projects/OWNER_PROJECT/reservations/NAME for one shared from another project, optionally followed by "
    "/reservationBlocks/BLOCK[/reservationSubBlocks/SUB_BLOCK]; each name 1-63 lowercase letters, digits and hyphens, "
    "starting with a letter"
)


class Reservation(Strict):
    """Consume a specific Compute Engine reservation (the node pools' reservation affinity value)."""

    reservation: Annotated[str, Field(min_length=1, pattern=_RESERVATION.pattern)]

    def _part(self, name: str) -> str | None:
        match = _RESERVATION.match(self.reservation)
        return match[name] if match else None

    @property
    def name(self) -> str:
        return self._part("name") or self.reservation

    @property
    def owner_project(self) -> str | None:
        """The project that shares the reservation, or None for one in the cluster's own project."""
        return self._part("project")

    @property
    def block(self) -> str | None:
        return self._part("block")


# `on-demand`: plain capacity; `spot`: preemptible; `flex-start`: Dynamic Workload Scheduler,
# provisioned when pods ask (no reservation); `queued-provisioning`: the same capacity, provisioned
# whole for a RayJob that Kueue admits through a ProvisioningRequest (needs `kueue`:
# infra.rules.queued_provisioning); `{reservation: NAME}`: a specific reservation.
CapacityKind = Literal["on-demand", "spot", "flex-start", "queued-provisioning"]
Capacity = CapacityKind | Reservation
FLEX_CAPACITY = ("flex-start", "queued-provisioning")


class Autoscaling(Strict):
    """Slices of a group scale between `min_slices` and the group's `slices`, whole slices at a time."""

    min_slices: NonNegativeInt = 0


class SliceGroup(Strict):
    """`slices` identical TPU slices. Each multi-host slice is its own node pool."""

    name: Name
    generation: str
    topology: str
    # Only needed where a topology fits one big host or several 4-chip hosts (v5e/v6e 2x4).
    chips_per_host: PositiveInt | None = Field(default=None, validate_default=True)
    slices: PositiveInt = 1
    capacity: Capacity = "on-demand"
    autoscaling: Autoscaling | None = None
    # The zone of the group's node pools; defaults to the environment's zone. Any zone of the region
    # that offers the generation, in a regional cluster and in a zonal one (a "multi-zonal" cluster).
    zone: Zone | None = None
    # Accept a zone that is not in Google's list as this repo last read it (a warning, not an error).
    unlisted_zone_ok: bool = False
    # What each Ray worker pod (one per host) requests besides its TPU chips. Defaults: 90% of what
    # the machine can give a pod (infra.rules.default_requests), so they always fit.
    pod_cpu: Quantity | None = None
    pod_memory: Quantity | None = None
    # Slices of this group that RayJobs take (a cluster per job, `jobs.submit --rayjob`), queued by
    # Kueue when the environment has a `kueue` section; the RayCluster holds the rest (less serving).
    rayjob_slices: NonNegativeInt = 0

    @field_validator("generation", mode="before")
    @classmethod
    def _known_generation(cls, value: Any) -> str:
        return catalog.generation(str(value)).name

    @field_validator("topology", mode="before")
    @classmethod
    def _offered_topology(cls, value: Any, info: ValidationInfo) -> str:
        topology = str(value).strip().lower()
        if "generation" in info.data:  # else the generation's own error already says why
            gen = catalog.generation(info.data["generation"])
            if topology not in gen.topologies:
                raise ValueError(f"{value!r} is not offered for {gen.name}; valid topologies: {', '.join(gen.topologies)}")
        return topology

    @field_validator("chips_per_host")
    @classmethod
    def _unambiguous_hosts(cls, value: int | None, info: ValidationInfo) -> int | None:
        if "generation" not in info.data or "topology" not in info.data:
            return value  # the generation's or the topology's own error already says why
        return catalog.shape(info.data["generation"], info.data["topology"], value).chips_per_host

    @field_validator("capacity", mode="before")
    @classmethod
    def _known_capacity(cls, value: Any) -> Any:
        # Checked here so that a bad value gets one sentence, not one per branch of the union.
        choices = f"{', '.join(typing.get_args(CapacityKind))} or {{reservation: NAME}}"
        if isinstance(value, dict):
            name = str(value.get("reservation") or "").strip()
            if set(value) != {"reservation"} or not name:
                raise ValueError(f"a reservation is written `capacity: {{reservation: NAME}}`; valid: {choices}")
            if not _RESERVATION.match(name):
                raise ValueError(f"reservation {name!r} is not a reservation reference: write {RESERVATION_HELP}")
            return Reservation(reservation=name)
        if isinstance(value, str) and value.startswith("reservation"):
            raise ValueError("a reservation needs its name: write `capacity: {reservation: NAME}`")
        if value not in typing.get_args(CapacityKind):
            raise ValueError(f"{value!r} is not a capacity; valid: {choices}")
        return value

    @model_validator(mode="after")
    def _rayjobs_within_slices(self) -> SliceGroup:
        if self.rayjob_slices > self.slices:
            raise ValueError(f"rayjob_slices ({self.rayjob_slices}) must be between 0 and slices ({self.slices})")
        return self

    @model_validator(mode="after")
    def _min_within_slices(self) -> SliceGroup:
        if self.autoscaling and self.autoscaling.min_slices > self.slices:
            raise ValueError(f"autoscaling.min_slices ({self.autoscaling.min_slices}) must be between 0 and slices ({self.slices})")
        return self

    @model_validator(mode="after")
    def _on_demand_capacity_starts_at_zero(self) -> SliceGroup:
        if self.capacity in FLEX_CAPACITY and self.autoscaling and self.autoscaling.min_slices:
            raise ValueError(f"capacity {self.capacity} provisions slices when pods ask for them: autoscaling.min_slices must be 0")
        return self

    @cached_property
    def shape(self) -> catalog.SliceShape:
        return catalog.shape(self.generation, self.topology, self.chips_per_host)

    @property
    def autoscaled(self) -> bool:
        """Flex-start capacity always scales from zero, with or without an `autoscaling` block."""
        return self.autoscaling is not None or self.capacity in FLEX_CAPACITY

    @property
    def min_slices(self) -> int:
        if not self.autoscaled:
            return self.slices
        return self.autoscaling.min_slices if self.autoscaling else 0

    @property
    def capacity_kind(self) -> str:
        return "reservation" if isinstance(self.capacity, Reservation) else self.capacity

    @property
    def requests(self) -> tuple[str, str]:
        """(cpu, memory) each worker pod requests: the config's, or derived from the machine."""
        cpu, memory = rules.default_requests(self.shape.machine_type)
        return self.pod_cpu or cpu, self.pod_memory or memory
