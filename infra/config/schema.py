"""The environment config's schema: pydantic models whose validators refuse, field by field, what
the platform or the catalog does not offer. Loading (YAML -> `Environment`) is `infra.config`;
the platform's rules over a whole environment are `infra.config.platform`."""

from __future__ import annotations

import re
import typing
from functools import cached_property
from ipaddress import IPv4Network
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationInfo, field_validator, model_validator

from infra import catalog, rules
from infra.config.errors import ConfigError
from infra.config.fields import (
    _BUCKET,
    _GKE_VERSION,
    _PROJECT,
    Cidr,
    Image,
    LabelKey,
    LabelValue,
    Name,
    Quantity,
    Strict,
    Zone,
)

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


class Network(Strict):
    subnet_cidr: Cidr = IPv4Network("10.10.0.0/20")
    pods_cidr: Cidr = IPv4Network("10.16.0.0/14")
    services_cidr: Cidr = IPv4Network("10.20.0.0/20")
    master_cidr: Cidr = IPv4Network("172.16.0.32/28")
    # Who may reach the control plane's IP endpoint. Empty: nobody outside the VPC.
    master_authorized_networks: list[Cidr] = []
    # The DNS-based control-plane endpoint, reachable from anywhere Google's APIs are (laptops,
    # Cloud Build's default pool) and guarded by IAM (container.clusters.connect), not by address.
    # kubectl credentials then use `get-credentials --dns-endpoint`.
    dns_endpoint: bool = True

    @field_validator("master_cidr")
    @classmethod
    def _master_is_28(cls, value: IPv4Network) -> IPv4Network:
        if value.prefixlen != 28:
            raise ValueError(f"GKE needs a /28 for the control plane, got /{value.prefixlen}")
        return value

    @model_validator(mode="after")
    def _no_overlap(self) -> Network:
        ranges = {
            "subnet_cidr": self.subnet_cidr,
            "pods_cidr": self.pods_cidr,
            "services_cidr": self.services_cidr,
            "master_cidr": self.master_cidr,
        }
        names = list(ranges)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if ranges[a].overlaps(ranges[b]):
                    raise ValueError(f"{a} {ranges[a]} overlaps {b} {ranges[b]}: each range must be disjoint")
        return self


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


class RayHead(Strict):
    cpu: Quantity = "4"
    memory: Quantity = "16Gi"


TPU_PYTHON = "py312"  # Ironwood's jax[tpu] needs Python >= 3.12; every Ray node runs one Python


class Peer(Strict):
    """Pods let in: every pod of `namespace`, the pods of the Ray namespace with `pod_labels`, or the
    pods with `pod_labels` in `namespace`."""

    namespace: Name | None = None
    pod_labels: dict[LabelKey, LabelValue] = {}

    @model_validator(mode="after")
    def _names_someone(self) -> Peer:
        if self.namespace is None and not self.pod_labels:
            raise ValueError("a peer needs a namespace, pod_labels or both, e.g. {namespace: ci} or {pod_labels: {app: gateway}}")
        return self


class RayAccess(Strict):
    """Who may reach the Ray clusters (infra.manifests.network_policy, README "Access")."""

    # `token`: Ray token authentication, the token in a Secret the KubeRay operator creates.
    auth: Literal["token"] = "token"
    # Pods allowed to the dashboard / Jobs API (8265) and Ray Client (10001). Default none:
    # `kubectl port-forward` (which network policies do not block) is the way in.
    dashboard_from: list[Peer] = []
    # Pods allowed to Ray Serve's HTTP port (8000), which Ray's token does not cover.
    serve_from: list[Peer] = []
    # A self-installed KubeRay operator's namespace. Default (None): the GKE add-on's operator,
    # which GKE hosts; its requests come from the control plane.
    operator_namespace: Name | None = None


class RayConfig(Strict):
    version: Annotated[str, Field(pattern=r"^2\.\d+\.\d+$")] = "2.60.0"
    # The head's image (CPU only).
    image: Image = "rayproject/ray:2.60.0-py312"
    # TPU worker images per generation, with jax[tpu] and libtpu in them. Default: Ray's prebuilt
    # TPU image, rayproject/ray:<version>-py312-tpu (jax 0.10 and libtpu, optax, orbax).
    tpu_images: dict[str, Image] = {}
    namespace: Name = "default"
    kubernetes_service_account: Name = "ray"
    head: RayHead = RayHead()
    # What every submitted job adds to the image (`make submit`): pip requirements and env vars.
    job_pip: list[Annotated[str, Field(min_length=1)]] = []
    job_env_vars: dict[Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")], str] = {}
    access: RayAccess = RayAccess()

    @field_validator("job_env_vars")
    @classmethod
    def _no_auth_in_jobs(cls, env_vars: dict[str, str]) -> dict[str, str]:
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            if key in env_vars:
                raise ValueError(f"{key} must not be set here: every Ray container gets the token from the cluster's Secret")
        return env_vars

    @field_validator("tpu_images")
    @classmethod
    def _known_generations(cls, images: dict[str, str]) -> dict[str, str]:
        return {catalog.generation(name).name: image for name, image in images.items()}

    @model_validator(mode="after")
    def _image_matches_version(self) -> RayConfig:
        for field, image in (("image", self.image), *((f"tpu_images.{g}", i) for g, i in self.tpu_images.items())):
            tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
            if image.startswith("rayproject/ray") and tag and not tag.startswith(self.version):
                raise ValueError(f"{field} {image!r} does not match version {self.version}: use rayproject/ray:{self.version}-...")
        return self

    @property
    def default_worker_image(self) -> str:
        """Ray's TPU image for this version: the base of the project's TPU image (infra.images)."""
        return f"rayproject/ray:{self.version}-{TPU_PYTHON}-tpu"

    def worker_image(self, generation: str) -> str:
        return self.tpu_images.get(generation) or self.default_worker_image


class KueueConfig(Strict):
    """Kueue queues the environment's RayJobs against quotas in chips (its presence turns it on).
    `python -m infra manifests` prints its ResourceFlavors, ClusterQueue and LocalQueue; the quota is
    the slices the groups leave to RayJobs (`rayjob_slices`). Kueue itself is installed once per
    cluster, from its pinned release (README "Batch jobs")."""

    # The LocalQueue RayJobs name (kueue.x-k8s.io/queue-name), in the Ray namespace. Never `default`:
    # Kueue gives a LocalQueue of that name every unlabelled workload, the long-lived RayCluster too.
    local_queue: Name = "ray-jobs"
    # The ClusterQueue; default `<cluster_name>-tpu`.
    cluster_queue: Name | None = None

    @field_validator("local_queue")
    @classmethod
    def _not_default(cls, value: str) -> str:
        if value == "default":
            raise ValueError(
                "a LocalQueue named `default` takes every workload without a queue-name label in its namespace "
                "(Kueue's default LocalQueue), the RayCluster and RayService too: pick another name, e.g. ray-jobs"
            )
        return value


class BucketConfig(Strict):
    """The GCS bucket for checkpoints and data. The name defaults to `<project>-<cluster>-ray`."""

    name: Annotated[str, Field(pattern=_BUCKET)] | None = None
    location: str | None = None  # defaults to the region
    force_destroy: bool = False


class Serving(Strict):
    """An LLM served with Ray Serve LLM (vLLM) on one slice group, as a KubeRay RayService."""

    # A `gs://` path in the environment's bucket (mounted with GCS FUSE) or a Hugging Face model id.
    model: Annotated[str, Field(min_length=1)]
    slice_group: Name
    max_model_len: Annotated[int, Field(ge=16, le=1_048_576)] = 2048
    replicas: PositiveInt = 1
    # The name of a Kubernetes Secret holding HF_TOKEN (a reference only: no token in our files).
    hf_token_secret: Name | None = None
    # An image with vllm-tpu baked in (images/serve.Dockerfile; `make images`, or SERVE_IMAGE=...).
    image: Annotated[str, Field(min_length=1)] | None = None
    # Development only: without an `image`, every replica start pip-installs vllm-tpu (minutes each
    # time). Off by default, so that the RayService of any other environment refuses to run without
    # the serving image (infra.serving.serve_pip).
    pip_install_vllm: bool = False

    @field_validator("model")
    @classmethod
    def _model_reference(cls, value: str) -> str:
        if value.startswith("gs://"):
            if not re.match(r"^gs://[a-z0-9][-_.a-z0-9]{1,61}[a-z0-9](/[^\s]+)+$", value):
                raise ValueError(f"{value!r} is not a gs://BUCKET/PATH to a model directory")
        elif not re.match(r"^[A-Za-z0-9][-_.A-Za-z0-9]*/[-_.A-Za-z0-9]+$", value):
            raise ValueError(f"{value!r} is neither a gs://BUCKET/PATH nor a Hugging Face id like org/name")
        return value

    @property
    def model_bucket(self) -> str | None:
        return self.model[5:].split("/", 1)[0] if self.model.startswith("gs://") else None


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
