"""What Google's platform offers and demands, as data beside the catalog: TPU zones per generation,
machine sizes, minimum GKE versions and boot disks. Each table names its source and the day it was
read; `infra.rules` checks configs against them. When Google adds a zone, a config accepts it with
`unlisted_zone_ok: true` (a warning) until this table is re-read: never edit a fact without its
source.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from infra.catalog import GiB

READ_ON = "2026-12-03"
READ_AGAIN = "2026-12-04"  # the second fidelity pass (issue 21): memory units, TPU7x flex-start, zones, reservations
MiB = 2**20


@dataclass(frozen=True)
class Source:
    title: str
    url: str
    read: str = READ_ON

    def cite(self) -> str:
        return f"{self.title} ({self.url}, read {self.read})"


TPU_ZONES_PAGE = Source('Cloud TPU "TPU regions and zones"', "https://cloud.google.com/tpu/docs/regions-zones")
FLEX_START_PAGE = Source(
    'GKE "About GPU, TPU, and H4D consumption with the flex-start provisioning mode"',
    "https://cloud.google.com/kubernetes-engine/docs/concepts/dws",
)
MACHINE_TYPES = Source(
    "Cloud TPU v5e/v5p/v6e/TPU7x pages (VM types tables) and `gcloud compute machine-types list`",
    "https://cloud.google.com/tpu/docs/tpu7x",
)
ALLOCATABLE_PAGE = Source(
    'GKE "Plan node sizes: memory and CPU reservations"',
    "https://cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes#memory_and_cpu_reservations",
)
IRONWOOD_PAGE = Source('GKE "About Ironwood (TPU7x) in GKE"', "https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood")
TPU7X_FLEX_START_EXAMPLE = Source(
    "cluster-toolkit examples/gke-consumption-options/dws-flex-start/gke-tpu-7x/ (GoogleCloudPlatform/cluster-toolkit@1047080: "
    "tpu7x-standard-4t 2x2x2, enable_flex_start, auto_repair false, `# example: us-central1-c`; xpk "
    "docs/usage/tpu7x/recipes/flex_filestore_recipe.md uses us-central1-c with --flex too)",
    "https://github.com/GoogleCloudPlatform/cluster-toolkit/tree/1047080/examples/gke-consumption-options/dws-flex-start/gke-tpu-7x",
    READ_AGAIN,
)
NODE_LOCATIONS = Source(
    'terraform-provider-google resource_container_node_pool.go `node_locations` ("Nodes must be in the region of their regional '
    'cluster or in the same region as their cluster\'s zone for zonal clusters"); provider docs: a "multi-zonal" cluster is a '
    "zonal cluster with at least one additional zone",
    "https://registry.terraform.io/providers/hashicorp/google/6.50.0/docs/resources/container_node_pool#node_locations-1",
    READ_AGAIN,
)
SHARED_RESERVATIONS = Source(
    'Compute Engine ReservationAffinity.values ("projects/different-project/reservations/some-reservation-name" for a '
    'shared reservation); Cloud TPU "Consume a reservation"; xpk src/xpk/core/reservation.py (reservationBlocks, '
    "reservationSubBlocks); reservation names are RFC 1035 labels of 1-63 characters",
    "https://cloud.google.com/compute/docs/reference/rest/v1/instances#ReservationAffinity",
    READ_AGAIN,
)
# Whether TPUs take queued provisioning was contested: xpk saw it refused in 2025 ("Flex start node
# pools don't support TPUs with queued provisioning", AI-Hypercomputer/xpk PR #900) and still limits
# it to GPUs; GKE's how-to documents GPUs only. Newer sources run TPUs on it, on pools with both
# --enable-queued-provisioning and --flex-start: the ray-kueue-dws tutorial and cluster-toolkit.
QUEUED_PROVISIONING_PAGE = Source(
    'GKE tutorial "Optimize AI training on TPUs with DWS and Kueue" (a RayJob on a v6e 4x4 pool made with '
    "--enable-queued-provisioning --flex-start --reservation-affinity=none, min 0 nodes; ProvisioningRequestConfig "
    "queued-provisioning.gke.io with managedResources [google.com/tpu]; last updated 2026-04-10); cluster-toolkit "
    "examples/gke-consumption-options/dws-flex-start-queued-provisioning (gke-tpu-v6e.yaml, @1047080); GKE accepts one "
    "PodSet per ProvisioningRequest (ray-project/ray#57839)",
    "https://cloud.google.com/kubernetes-engine/docs/tutorials/ray-kueue-dws",
    READ_AGAIN,
)
NODE_CAPACITY = Source(
    "2i2c-org/infrastructure deployer/commands/generate/resource_allocation/instance_capacities.yaml (kubelet capacity "
    "measured on GKE nodes: n1-standard-2 7.276 of 7.5 GiB, n2-highmem-4 31.357 of 32, n2-highmem-64 503.89 of 512; "
    "allocatable = capacity - GKE's reservation of the capacity)",
    "https://github.com/2i2c-org/infrastructure/blob/main/deployer/commands/generate/resource_allocation/instance_capacities.yaml",
    READ_AGAIN,
)


@dataclass(frozen=True)
class TpuZones:
    """Where a generation can be had. `flex_start` is GKE's shorter list for flex-start capacity;
    None where GKE says flex-start does not support the generation at all."""

    generation: str
    zones: tuple[str, ...]
    flex_start: tuple[str, ...] | None
    note: str = ""


# Cloud TPU "TPU regions and zones" (North America rows in full; Europe and Asia rows as far as the
# page could be read) and GKE's flex-start page ("TPU Trillium (v6e) in asia-northeast1-b,
# us-east5-a, us-east5-b; TPU v5e in us-west4-a; TPU v5p in us-east5-a. TPU v3 and v4 are not
# supported."). TPU7x is not in GKE's flex-start page as read, but Google's own cluster-toolkit
# ships a TPU7x flex-start blueprint (TPU7X_FLEX_START_EXAMPLE, example zone us-central1-c), and
# xpk's TPU7x flex recipe uses the same zone: the blueprint wins over the page's older list.
TPU_ZONES: dict[str, TpuZones] = {
    z.generation: z
    for z in (
        TpuZones("tpu7x", ("us-central1-ai1a", "us-central1-c"), flex_start=("us-central1-c",)),
        TpuZones(
            "v6e",
            ("asia-northeast1-b", "europe-west4-a", "us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "us-south1-ai1b"),
            flex_start=("asia-northeast1-b", "us-east5-a", "us-east5-b"),
        ),
        TpuZones("v5p", ("us-central1-a", "us-east5-a"), flex_start=("us-east5-a",)),
        TpuZones("v5e", ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"), flex_start=("us-west4-a",)),
        TpuZones("v4", ("us-central2-b",), flex_start=None, note="quota in us-central2-b is approved by hand"),
    )
}


# What the kubelet reports as a node's memory capacity, at least, as a share of the machine type's
# memory: the kernel and firmware keep the rest. Measured on GKE (NODE_CAPACITY): 3.0% short on an
# n1-standard-2, 1.6-2.0% on n2-highmem-4 to -64; no TPU node's figure is published, so the worst
# measured shortfall is assumed.
NODE_CAPACITY_SHARE = Decimal("0.97")


@dataclass(frozen=True)
class MachineSize:
    """A TPU VM's size as Compute Engine reports it: memory in GiB (gcloud's MEMORY_GB column is
    memoryMb / 1024: an e2-standard-8 shows 32.00)."""

    machine_type: str
    vcpus: int
    memory_gib: int

    @property
    def allocatable_cpu(self) -> Decimal:
        """Cores left for pods after GKE's CPU reservation (6% of the first core, 1% of the next,
        0.5% of the next 2, 0.25% of any above 4)."""
        total = Decimal(self.vcpus)
        reserved = Decimal(0)
        for low, high, share in ((0, 1, "0.06"), (1, 2, "0.01"), (2, 4, "0.005"), (4, None, "0.0025")):
            upper = total if high is None else min(total, Decimal(high))
            reserved += max(Decimal(0), upper - low) * Decimal(share)
        return total - reserved

    @property
    def capacity_memory(self) -> int:
        """Bytes the kubelet reports as the node's memory capacity (NODE_CAPACITY_SHARE of the machine's)."""
        return int(Decimal(self.memory_gib * GiB) * NODE_CAPACITY_SHARE)

    @property
    def allocatable_memory(self) -> int:
        """Bytes left for pods: GKE's memory reservation (25% of the first 4 GiB, 20% of the next 4,
        10% of the next 8, 6% of the next 112, 2% above 128 GiB) and the 100 MiB eviction threshold,
        both taken from the kubelet's capacity (the formula's input, ALLOCATABLE_PAGE)."""
        total = Decimal(self.capacity_memory)
        reserved = Decimal(0)
        for low, high, share in ((0, 4, "0.25"), (4, 8, "0.20"), (8, 16, "0.10"), (16, 128, "0.06"), (128, None, "0.02")):
            upper = total if high is None else min(total, Decimal(high * GiB))
            reserved += max(Decimal(0), upper - low * GiB) * Decimal(share)
        return int(total - reserved - 100 * MiB)


# Source: MACHINE_TYPES (memory in GiB, as gcloud's MEMORY_GB column). ct4p-hightpu-4t and tpu7x-standard-1t come only from a
# `gcloud compute machine-types list` dump (Cyclenerd/google-cloud-pricing-cost-calculator
# tools/machinetypes.csv); the rest also from Cloud TPU's per-generation pages.
MACHINES: dict[str, MachineSize] = {
    m.machine_type: m
    for m in (
        MachineSize("ct6e-standard-1t", 44, 176),
        MachineSize("ct6e-standard-4t", 180, 720),
        MachineSize("ct6e-standard-8t", 360, 1440),
        MachineSize("ct5lp-hightpu-1t", 24, 48),
        MachineSize("ct5lp-hightpu-4t", 112, 192),
        MachineSize("ct5lp-hightpu-8t", 224, 384),
        MachineSize("ct5p-hightpu-4t", 208, 448),
        MachineSize("ct4p-hightpu-4t", 240, 407),
        MachineSize("tpu7x-standard-1t", 56, 240),
        MachineSize("tpu7x-standard-4t", 224, 960),
    )
}


@dataclass(frozen=True)
class MinVersion:
    """The oldest GKE version a feature runs on."""

    feature: str
    version: str
    source: Source


MIN_VERSIONS: dict[str, MinVersion] = {
    v.feature: v
    for v in (
        # "Ironwood (TPU7x) is available in GKE Standard clusters that run version 1.34.0-gke.2201000
        # and later, and in Autopilot clusters that run version 1.34.1-gke.3084001 and later."
        MinVersion("tpu7x on Standard", "1.34.0-gke.2201000", IRONWOOD_PAGE),
        MinVersion("tpu7x on Autopilot", "1.34.1-gke.3084001", IRONWOOD_PAGE),
        # "To run TPUs, use GKE version 1.33.0-gke.1712000 or later."
        MinVersion("flex-start TPUs", "1.33.0-gke.1712000", FLEX_START_PAGE),
    )
}

# The topologies Ray's `ray.util.tpu` (2.60.0, ray/_private/accelerators/tpu.py VALID_TPU_TOPOLOGY)
# knows, by our generation name: a slice of another shape can be deployed, but Ray's
# slice_placement_group cannot reserve it. tests/infra/test_catalog.py checks this against the
# installed Ray.
RAY_VERSION_READ = "2.60.0"
RAY_TPU_TOPOLOGIES: dict[str, frozenset[str]] = {
    "v4": frozenset(
        {
            "2x2x1",
            "2x2x2",
            "2x2x4",
            "2x4x4",
            "4x4x4",
            "4x4x8",
            "4x4x12",
            "4x4x16",
            "4x8x4",
            "4x8x8",
            "4x8x12",
            "4x8x16",
            "4x12x4",
            "4x12x8",
            "4x12x12",
            "4x12x16",
            "8x4x4",
            "8x4x8",
            "8x4x12",
            "8x4x16",
            "8x8x4",
            "8x8x8",
            "8x8x12",
            "8x8x16",
            "8x12x4",
            "8x12x8",
            "8x12x12",
            "8x12x16",
            "12x4x4",
            "12x4x8",
            "12x4x12",
            "12x4x16",
            "12x8x4",
            "12x8x8",
            "12x8x12",
            "12x8x16",
            "12x12x4",
            "12x12x8",
            "12x12x12",
            "12x12x16",
        }
    ),
    "v5p": frozenset(
        {
            "2x2x1",
            "2x2x2",
            "2x2x4",
            "2x4x4",
            "4x4x4",
            "4x4x8",
            "4x4x12",
            "4x4x16",
            "4x4x20",
            "4x4x24",
            "4x8x4",
            "4x8x8",
            "4x8x12",
            "4x8x16",
            "4x8x20",
            "4x8x24",
            "4x12x4",
            "4x12x8",
            "4x12x12",
            "4x12x16",
            "4x12x20",
            "4x12x24",
            "4x16x4",
            "4x16x8",
            "4x16x12",
            "4x16x16",
            "4x16x20",
            "4x16x24",
            "8x4x4",
            "8x4x8",
            "8x4x12",
            "8x4x16",
            "8x4x20",
            "8x4x24",
            "8x8x4",
            "8x8x8",
            "8x8x12",
            "8x8x16",
            "8x8x20",
            "8x8x24",
            "8x12x4",
            "8x12x8",
            "8x12x12",
            "8x12x16",
            "8x12x20",
            "8x12x24",
            "8x16x4",
            "8x16x8",
            "8x16x12",
            "8x16x16",
            "8x16x20",
            "8x16x24",
            "12x4x4",
            "12x4x8",
            "12x4x12",
            "12x4x16",
            "12x4x20",
            "12x4x24",
            "12x8x4",
            "12x8x8",
            "12x8x12",
            "12x8x16",
            "12x8x20",
            "12x8x24",
            "12x12x4",
            "12x12x8",
            "12x12x12",
            "12x12x16",
            "12x12x20",
            "12x12x24",
            "12x16x4",
            "12x16x8",
            "12x16x12",
            "12x16x16",
            "12x16x20",
            "12x16x24",
            "16x4x4",
            "16x4x8",
            "16x4x12",
            "16x4x16",
            "16x4x20",
            "16x4x24",
            "16x8x4",
            "16x8x8",
            "16x8x12",
            "16x8x16",
            "16x8x20",
            "16x8x24",
            "16x12x4",
            "16x12x8",
            "16x12x12",
            "16x12x16",
            "16x12x20",
            "16x12x24",
            "16x16x4",
            "16x16x8",
            "16x16x12",
            "16x16x16",
            "16x16x20",
            "16x16x24",
        }
    ),
    "v5e": frozenset({"1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"}),
    "v6e": frozenset({"1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"}),
    "tpu7x": frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"}),
}

# Boot disks: Google's TPU7x and v6e blueprints give TPU hosts hyperdisk-balanced boot disks
# (cluster-toolkit examples/gke-tpu-7x/gke-tpu-7x.yaml and examples/gke-tpu-v6e/gke-tpu-v6e.yaml,
# `disk_type: hyperdisk-balanced`); other generations keep GKE's default.
BOOT_DISK_TYPES: dict[str, str] = {"tpu7x": "hyperdisk-balanced", "v6e": "hyperdisk-balanced"}

# What a TPU worker pod asks for by default: this share of the machine's allocatable CPU and memory,
# leaving the rest to GKE's DaemonSets on the node (logging, metadata server, TPU device plugin,
# the GCS FUSE sidecar).
DEFAULT_POD_SHARE = Decimal("0.9")


def version_key(version: str) -> tuple[int, ...]:
    """ "1.34.0-gke.2201000" -> (1, 34, 0, 2201000). A fuzzy "1.34" means the newest 1.34 GKE
    offers, so its missing parts sort after every patch of that minor."""
    head, _, build = version.partition("-gke.")
    parts = [int(p) for p in head.split(".")]
    big = 10**12
    while len(parts) < 3:
        parts.append(big)
    return (*parts, int(build) if build else big)


# --- KubeRay (the GKE Ray Operator add-on runs it) ------------------------------------------------

KUBERAY_REPO = Source(
    "ray-project/kuberay @feeaf72 (ray-operator/apis/ray/v1/raycluster_types.go AuthOptions; tags ray-operator/v1.5.1, v1.6.0)",
    "https://github.com/ray-project/kuberay/blob/feeaf72facab4881ba2b179248bb67315634e229/ray-operator/apis/ray/v1/raycluster_types.go",
)
GKE_RAY_ADDON_PAGE = Source(
    'GKE "About Ray on GKE" (GKE installs, hosts and upgrades the KubeRay operator)',
    "https://cloud.google.com/kubernetes-engine/docs/add-on/ray-on-gke/concepts/overview",
)


@dataclass(frozen=True)
class KubeRayFeature:
    field: str
    since: str  # the first KubeRay release with it
    note: str
    source: Source = KUBERAY_REPO


KUBERAY_AUTH = (
    KubeRayFeature(
        "authOptions.mode", "1.5.1", "token: the operator makes the Secret, injects RAY_AUTH_* and sends the token to the dashboard"
    ),
    KubeRayFeature("authOptions.secretName", "1.6.0", "a Secret of our own instead of the operator's"),
    KubeRayFeature(
        "authOptions.enableK8sTokenAuth", "1.6.0", "Kubernetes RBAC in place of the token (Ray >= 2.55); refused for RayService and RayJob"
    ),
)
# Which KubeRay the GKE Ray Operator add-on runs: not published (GKE_RAY_ADDON_PAGE, read 2026-12-03).
# `python -m infra.doctor --kubectl` reads the live cluster's CRD instead (infra.kuberay_crd).
GKE_RAY_ADDON_KUBERAY: str | None = None
