"""The platform's rules, as pure functions over plain values and `infra.platform_facts`.

Each returns None when the rule holds, else one sentence that says what is wrong, what would be
valid, and where the rule comes from. `infra.config` applies them to every field they concern and
reports one line per problem (a `ConfigError`), or a warning where the config chose to accept the
risk. Nothing here imports the config: the rules are tested on their own (tests/infra/test_rules.py).
"""

from __future__ import annotations

from decimal import Decimal

from infra import quantity
from infra.platform_facts import (
    ALLOCATABLE_PAGE,
    DEFAULT_POD_SHARE,
    FLEX_START_PAGE,
    MACHINE_TYPES,
    MACHINES,
    MIN_VERSIONS,
    NODE_CAPACITY,
    NODE_CAPACITY_SHARE,
    NODE_LOCATIONS,
    QUEUED_PROVISIONING_PAGE,
    RAY_TPU_TOPOLOGIES,
    RAY_VERSION_READ,
    TPU_ZONES,
    TPU_ZONES_PAGE,
    version_key,
)


def queued_provisioning(mode: str, kueue: bool, group: str, slices: int, rayjob_slices: int, serves: bool) -> str | None:
    """Queued-provisioning pools scale up only for a ProvisioningRequest, which Kueue makes for a RayJob
    it admits (a KubeRay RayCluster or RayService worker group cannot); GKE taints them
    cloud.google.com/gke-queued. So: Standard, Kueue on, and every slice of the group left to RayJobs."""
    if mode != "standard":
        return f"queued-provisioning is for Standard node pools (--enable-queued-provisioning); on Autopilot use flex-start (source: {QUEUED_PROVISIONING_PAGE.cite()})"
    if not kueue:
        return (
            "queued-provisioning pools scale up only for ProvisioningRequests, which Kueue makes for the RayJobs it "
            "admits: add a `kueue:` section (and rayjob_slices), or use capacity: flex-start "
            f"(source: {QUEUED_PROVISIONING_PAGE.cite()})"
        )
    if serves or rayjob_slices != slices:
        return (
            f"a queued-provisioning group's slices are provisioned only for RayJobs: set rayjob_slices to {slices} "
            f"(now {rayjob_slices}) and serve from another group, so no RayCluster or RayService waits on a pool that "
            f"never scales up for it (source: {QUEUED_PROVISIONING_PAGE.cite()})"
        )
    return None


def capacity_offered(generation: str, capacity: str) -> str | None:
    """Flex-start (and queued provisioning, the same capacity) exists only for some generations (no
    zone can change that)."""
    if capacity in ("flex-start", "queued-provisioning") and TPU_ZONES[generation].flex_start is None:
        return f"flex-start does not support {generation} TPUs (source: {FLEX_START_PAGE.cite()})"
    return None


def zone_offers(generation: str, zone: str, capacity: str) -> str | None:
    """The zone must offer the generation (and flex-start there, for flex-start capacity)."""
    if problem := capacity_offered(generation, capacity):
        return problem
    facts = TPU_ZONES[generation]
    if capacity in ("flex-start", "queued-provisioning") and facts.flex_start is not None:
        if zone not in facts.flex_start:
            listed = ", ".join(facts.flex_start) or "none"
            return f"zone {zone} does not offer {generation} on flex-start; zones that do: {listed} (source: {FLEX_START_PAGE.cite()})"
        return None
    if zone not in facts.zones:
        return f"zone {zone} does not offer {generation}; zones that do: {', '.join(facts.zones)} (source: {TPU_ZONES_PAGE.cite()})"
    return None


def ray_knows(generation: str, topology: str) -> str | None:
    """GKE offers more shapes than Ray's TPU table: such a slice deploys, but Ray's
    slice_placement_group cannot reserve it (a warning: the pools and RayCluster still work)."""
    if topology in RAY_TPU_TOPOLOGIES[generation]:
        return None
    return (
        f"Ray {RAY_VERSION_READ}'s ray.util.tpu does not know {generation} {topology}: the slice deploys, but the "
        f"jobs here cannot reserve it with slice_placement_group (Ray's VALID_TPU_TOPOLOGY)"
    )


def zone_in_cluster(region: str, zone: str) -> str | None:
    """A cluster's node pools live in its region: a regional cluster's in any of its zones, and a
    zonal one's too (a "multi-zonal" cluster: pools in other zones of the cluster's region)."""
    if not zone.startswith(region + "-"):
        return f"zone {zone} is not in region {region}: node pools must be in the cluster's region (source: {NODE_LOCATIONS.cite()})"
    return None


def unlisted_reserved_zone(generation: str, zone: str) -> str:
    """A reservation exists where Google made it: a zone missing from the public list is a warning."""
    return (
        f"zone {zone} is not in Google's public list for {generation} ({', '.join(TPU_ZONES[generation].zones)}; source: "
        f"{TPU_ZONES_PAGE.cite()}); accepted because the capacity is a reservation, which Google also makes in zones "
        f"that list omits (the reservation itself decides: a pool in the wrong zone fails to create)"
    )


def requests_fit(machine_type: str, cpu: str, memory: str) -> dict[str, str]:
    """A pod's requests must fit the machine's allocatable CPU and memory, or it never schedules.
    {field: problem} for `pod_cpu` and `pod_memory`; empty when both fit."""
    machine = MACHINES[machine_type]
    sources = f"sources: {ALLOCATABLE_PAGE.cite()}; {MACHINE_TYPES.cite()}"
    memory_sources = f"{sources}; {NODE_CAPACITY.cite()}"
    problems = {}
    if quantity.parse(cpu) > machine.allocatable_cpu:
        problems["pod_cpu"] = (
            f"pod_cpu {cpu} is more than a {machine_type} node can give a pod "
            f"({machine.allocatable_cpu:.2f} of its {machine.vcpus} vCPUs are allocatable); "
            f"use at most {quantity.cpu(int(machine.allocatable_cpu))} ({sources})"
        )
    if quantity.parse(memory) > machine.allocatable_memory:
        problems["pod_memory"] = (
            f"pod_memory {memory} is more than a {machine_type} node can give a pod "
            f"({machine.allocatable_memory / 2**30:.1f}Gi of its {machine.memory_gib} GiB are allocatable, GKE's reservations "
            f"taken from the kubelet's capacity, counted as {float(NODE_CAPACITY_SHARE):.0%} of the machine's); "
            f"use at most {quantity.gib_at_most(machine.allocatable_memory)} ({memory_sources})"
        )
    return problems


def default_requests(machine_type: str) -> tuple[str, str]:
    """(cpu, memory) a TPU worker pod asks for unless the config says: a share of what the machine
    can give, so the default always fits."""
    machine = MACHINES[machine_type]
    cpu = int(machine.allocatable_cpu * DEFAULT_POD_SHARE)
    memory = int(Decimal(machine.allocatable_memory) * DEFAULT_POD_SHARE)
    return quantity.cpu(cpu), quantity.gib_at_most(memory)


def required_versions(mode: str, generations: set[str], capacities: set[str]) -> list[str]:
    """The features (keys of MIN_VERSIONS) an environment uses that need a newer GKE than some
    release channels still offer."""
    features = []
    if "tpu7x" in generations:
        features.append("tpu7x on Autopilot" if mode == "autopilot" else "tpu7x on Standard")
    if capacities & {"flex-start", "queued-provisioning"}:
        features.append("flex-start TPUs")
    return features


def version_covers(gke_min_version: str | None, features: list[str]) -> str | None:
    """A feature newer than what every GKE version runs needs `gke_min_version` at least its minimum:
    otherwise GKE may create the cluster on an older version, where the pools fail to create."""
    if not features:
        return None
    needed = max((MIN_VERSIONS[f] for f in features), key=lambda v: version_key(v.version))
    if gke_min_version is not None and version_key(gke_min_version) >= version_key(needed.version):
        return None
    have = f"gke_min_version {gke_min_version}" if gke_min_version else "no gke_min_version"
    return (
        f"{needed.feature} needs GKE {needed.version} or later, and the config sets {have}: set gke_min_version "
        f"to {needed.version} or a newer version your release channel offers (e.g. "
        f"'{'.'.join(needed.version.split('.')[:2])}'; see `gcloud container get-server-config`) "
        f"(source: {needed.source.cite()})"
    )


def serving_budget(group: str, slices: int, replicas: int, rayjob_slices: int = 0) -> str | None:
    """The RayService's replicas and the RayJobs' slices are slices taken from the group; the
    RayCluster gets the rest. A slice belongs to one of them."""
    if replicas + rayjob_slices > slices:
        what = f"serving.replicas ({replicas})" + (f" plus rayjob_slices ({rayjob_slices})" if rayjob_slices else "")
        return (
            f"{what} is more than slice group {group} has slices ({slices}): each replica and each RayJob slice holds a "
            f"whole slice; raise the group's slices, or lower serving.replicas or rayjob_slices"
        )
    return None


def python_tag(image: str) -> str | None:
    """The Python of a rayproject/ray image from its tag ("2.60.0-py312-tpu" -> "3.12"); None for
    other images. A rayproject tag without one is Python 3.10 (Ray's default image tag)."""
    name, _, tag = image.rpartition(":")
    if "rayproject/ray" not in name or not tag:
        return None
    for part in tag.split("-"):
        if part.startswith("py") and part[2:].isdigit():
            return f"{part[2]}.{part[3:]}"
    return "3.10"


def images_agree(head_image: str, worker_images: dict[str, str]) -> list[str]:
    """Every Ray node of a cluster runs one Python; TPU7x needs jax[tpu] >= 0.8.2, which has no
    Python 3.10/3.11 build in Ray's TPU images (ray-project/ray issue #62402, PR #63006)."""
    problems = []
    head_py = python_tag(head_image)
    for generation, image in worker_images.items():
        py = python_tag(image)
        if head_py and py and py != head_py:
            problems.append(
                f"the {generation} worker image {image} runs Python {py} but the head image {head_image} "
                f"runs Python {head_py}: Ray needs one Python version across a cluster"
            )
        if generation == "tpu7x" and py and version_key(py) < version_key("3.12"):
            problems.append(
                f"the tpu7x worker image {image} runs Python {py}: Ironwood needs jax[tpu] >= 0.8.2 on "
                f"Python >= 3.12 (ray-project/ray issue #62402); use a -py312-tpu image"
            )
    return problems
