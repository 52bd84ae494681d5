"""The TPU catalog: every slice shape GKE offers, as data.

Everything else (node pools, the RayCluster, the jobs' defaults and MFU) is derived from this table,
so it is the one place to fix when Google adds a shape. Pure Python, no dependencies: the jobs use it
on the Ray cluster too.

Vocabulary: a *host* is one VM = one GKE node = one KubeRay pod (`numOfHosts` counts them). Google's
per-generation pages sometimes count 8-chip physical hosts instead; we never do.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from math import prod

GB = 10**9
GiB = 2**30


class CatalogError(ValueError):
    """An unknown generation or topology, or an ambiguous shape: the message lists the valid ones."""


@dataclass(frozen=True)
class CubeRule:
    """Multi-cube 3-D shapes: AxBxC, every side a multiple of 4 (at most 256), whose (A/4)(B/4)(C/4)
    cubes number at most `max_cubes`; `nondecreasing` admits only A <= B <= C (v4 also takes
    permutations such as 8x4x4). Source: xpk `system_characteristics.py`, generate_tpu_topologies
    (AI-Hypercomputer/xpk@367c838, read 2026-12-03); cluster-toolkit's hardware.go has the same
    max cubes (ct4 64, ct5p 140, tpu7x 144)."""

    max_cubes: int
    nondecreasing: bool = True

    def topologies(self) -> tuple[str, ...]:
        out = []
        for x in range(4, 257, 4):
            for y in range(x if self.nondecreasing else 4, 257, 4):
                for z in range(y if self.nondecreasing else 4, 257, 4):
                    if (x // 4) * (y // 4) * (z // 4) <= self.max_cubes:
                        out.append(f"{x}x{y}x{z}")
        return tuple(out)


@dataclass(frozen=True)
class Generation:
    """One TPU generation as GKE and Ray name it."""

    name: str  # ours and the config's: "v6e", "tpu7x"
    aliases: tuple[str, ...]  # other names users type: "trillium", "v7x", "v5litepod"
    gke_accelerator: str  # node label cloud.google.com/gke-tpu-accelerator
    ray_version: str  # Ray's accelerator_version, the prefix of its pod types: "v6e", "v5litepod", "v7x"
    machine_type_pattern: str  # "ct6e-standard-{chips}t"
    tensorcores_per_chip: int  # Ray's pod types count TensorCores: v5p 2x2x1 (4 chips) is v5p-8
    jax_devices_per_chip: int  # v4/v5p run megacore (one device per chip); TPU7x shows each core
    peak_bf16_flops_per_chip: float
    hbm_bytes_per_chip: int
    listed_topologies: tuple[str, ...]  # shapes named one by one, smallest first
    single_host_chips_per_host: tuple[int, ...]  # machine sizes for shapes that fit one host
    multi_host_chips_per_host: int = 4  # every multi-host slice is built from 4-chip hosts
    # 3-D generations also offer every cuboid of whole 4x4x4 cubes up to a pod's size (xpk's
    # generate_tpu_topologies: max cubes, and whether the sides must not decrease).
    cubes: CubeRule | None = None

    @property
    def topologies(self) -> tuple[str, ...]:
        """Every slice shape GKE offers for the generation, smallest first."""
        return _topologies(self)

    def offers(self, topology: str) -> bool:
        return topology in _topology_set(self)

    def describe_topologies(self) -> str:
        """The valid topologies, in words short enough for an error message."""
        if self.cubes is None:
            return ", ".join(self.listed_topologies)
        order = "A<=B<=C, " if self.cubes.nondecreasing else ""
        return (
            f"{', '.join(self.listed_topologies)}, or AxBxC ({order}each a multiple of 4 up to 256, "
            f"at most {self.cubes.max_cubes} cubes of 4x4x4 chips)"
        )

    @property
    def ray_accelerator_type(self) -> str:
        """The Ray resource / `ScalingConfig(accelerator_type=...)` name: "TPU-V6E"."""
        return f"TPU-{self.ray_version.upper()}"

    def machine_type(self, chips_per_host: int) -> str:
        return self.machine_type_pattern.format(chips=chips_per_host)

    def chips_per_host_options(self, topology: str) -> tuple[int, ...]:
        """How the shape can be cut into hosts. Two options means the shape is ambiguous."""
        chips = topology_chips(topology)
        options = [c for c in self.single_host_chips_per_host if c == chips]
        multi = self.multi_host_chips_per_host
        if chips > multi and chips % multi == 0:
            options.append(multi)
        return tuple(sorted(set(options), reverse=True))


@dataclass(frozen=True)
class SliceShape:
    """One slice: a generation, a topology and how it is cut into hosts. Everything else derives."""

    generation: Generation
    topology: str
    chips_per_host: int

    @property
    def chips(self) -> int:
        return topology_chips(self.topology)

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def machine_type(self) -> str:
        return self.generation.machine_type(self.chips_per_host)

    @property
    def pod_type(self) -> str:
        """Ray's (and Cloud TPU's) accelerator type: "v6e-16", "v5p-16", "v7x-128"."""
        return f"{self.generation.ray_version}-{self.chips * self.generation.tensorcores_per_chip}"

    @property
    def jax_devices(self) -> int:
        return self.chips * self.generation.jax_devices_per_chip

    @property
    def jax_devices_per_host(self) -> int:
        return self.chips_per_host * self.generation.jax_devices_per_chip

    @property
    def peak_bf16_flops(self) -> float:
        return self.chips * self.generation.peak_bf16_flops_per_chip

    @property
    def hbm_bytes(self) -> int:
        return self.chips * self.generation.hbm_bytes_per_chip

    def __str__(self) -> str:
        return f"{self.generation.name} {self.topology} ({self.pod_type}: {self.chips} chips on {self.hosts} x {self.machine_type})"


def topology_chips(topology: str) -> int:
    return prod(int(d) for d in topology.split("x"))


@cache
def _topologies(gen: Generation) -> tuple[str, ...]:
    generated = gen.cubes.topologies() if gen.cubes else ()
    both = dict.fromkeys((*gen.listed_topologies, *generated))
    return tuple(sorted(both, key=lambda t: (topology_chips(t), [int(d) for d in t.split("x")])))


@cache
def _topology_set(gen: Generation) -> frozenset[str]:
    return frozenset(_topologies(gen))


_2D = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
_3D_BASE = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")

GENERATIONS: tuple[Generation, ...] = (
    Generation(
        name="tpu7x",
        aliases=("v7x", "ironwood", "tpu-v7x"),
        gke_accelerator="tpu7x",
        ray_version="v7x",
        machine_type_pattern="tpu7x-standard-{chips}t",
        tensorcores_per_chip=2,
        jax_devices_per_chip=2,
        peak_bf16_flops_per_chip=2307e12,
        hbm_bytes_per_chip=192 * GiB,
        # 1x1x1: one chip on tpu7x-standard-1t (xpk's tpu7x-2).
        listed_topologies=("1x1x1", *_3D_BASE),
        single_host_chips_per_host=(1, 4),
        cubes=CubeRule(max_cubes=144),
    ),
    Generation(
        name="v6e",
        aliases=("trillium", "tpu-v6e"),
        gke_accelerator="tpu-v6e-slice",
        ray_version="v6e",
        machine_type_pattern="ct6e-standard-{chips}t",
        tensorcores_per_chip=1,
        jax_devices_per_chip=1,
        peak_bf16_flops_per_chip=918e12,
        hbm_bytes_per_chip=32 * GB,
        listed_topologies=_2D,
        single_host_chips_per_host=(1, 4, 8),
    ),
    Generation(
        name="v5e",
        aliases=("v5litepod", "v5lite", "tpu-v5-lite-podslice"),
        gke_accelerator="tpu-v5-lite-podslice",
        ray_version="v5litepod",
        machine_type_pattern="ct5lp-hightpu-{chips}t",
        tensorcores_per_chip=1,
        jax_devices_per_chip=1,
        peak_bf16_flops_per_chip=197e12,
        hbm_bytes_per_chip=16 * GB,
        listed_topologies=_2D,
        single_host_chips_per_host=(1, 4, 8),
    ),
    Generation(
        name="v5p",
        aliases=("tpu-v5p",),
        gke_accelerator="tpu-v5p-slice",
        ray_version="v5p",
        machine_type_pattern="ct5p-hightpu-{chips}t",
        tensorcores_per_chip=2,
        jax_devices_per_chip=1,
        peak_bf16_flops_per_chip=459e12,
        hbm_bytes_per_chip=95 * GB,
        listed_topologies=_3D_BASE,
        single_host_chips_per_host=(4,),
        cubes=CubeRule(max_cubes=140),
    ),
    Generation(
        name="v4",
        aliases=("tpu-v4",),
        gke_accelerator="tpu-v4-podslice",
        ray_version="v4",
        machine_type_pattern="ct4p-hightpu-{chips}t",
        tensorcores_per_chip=2,
        jax_devices_per_chip=1,
        peak_bf16_flops_per_chip=275e12,
        hbm_bytes_per_chip=32 * GiB,  # Cloud TPU "TPU v4" page: "32 GiB, 1200 GBps"
        listed_topologies=_3D_BASE,
        single_host_chips_per_host=(4,),
        cubes=CubeRule(max_cubes=64, nondecreasing=False),
    ),
)

GENERATION_NAMES: tuple[str, ...] = tuple(g.name for g in GENERATIONS)


def _by_any_name() -> dict[str, Generation]:
    names: dict[str, Generation] = {}
    for gen in GENERATIONS:
        for name in (gen.name, gen.gke_accelerator, gen.ray_version, *gen.aliases):
            names[name.lower()] = gen
    return names


_GENERATIONS_BY_NAME = _by_any_name()


def generation(name: str) -> Generation:
    """Look a generation up by our name, an alias, its GKE label or Ray's name."""
    try:
        return _GENERATIONS_BY_NAME[str(name).strip().lower()]
    except KeyError:
        raise CatalogError(f"unknown TPU generation {name!r}; valid generations: {', '.join(GENERATION_NAMES)}") from None


def shape(gen: str | Generation, topology: str, chips_per_host: int | None = None) -> SliceShape:
    """The slice shape for a generation and topology.

    `chips_per_host` is needed only where a topology fits either one large host or several 4-chip
    hosts (v5e/v6e `2x4`); elsewhere it is derived, and a value that disagrees is an error.
    """
    g = gen if isinstance(gen, Generation) else generation(gen)
    topo = str(topology).strip().lower()
    if not g.offers(topo):
        raise CatalogError(f"topology {topology!r} is not offered for {g.name}; valid topologies: {g.describe_topologies()}")
    options = g.chips_per_host_options(topo)
    if chips_per_host is None:
        if len(options) > 1:
            choices = " or ".join(f"chips_per_host={c} ({topology_chips(topo) // c} x {g.machine_type(c)})" for c in options)
            raise CatalogError(f"{g.name} {topo} is ambiguous: choose {choices}")
        chips_per_host = options[0]
    elif chips_per_host not in options:
        raise CatalogError(
            f"{g.name} {topo} cannot be built from {chips_per_host}-chip hosts; valid chips_per_host: {', '.join(map(str, options))}"
        )
    return SliceShape(g, topo, chips_per_host)


def shapes(gen: str | Generation | None = None) -> list[SliceShape]:
    """Every offered shape (both cuts of an ambiguous topology), optionally of one generation."""
    gens = GENERATIONS if gen is None else (gen if isinstance(gen, Generation) else generation(gen),)
    return [SliceShape(g, topo, c) for g in gens for topo in g.topologies for c in g.chips_per_host_options(topo)]


def shape_for_pod_type(pod_type: str) -> SliceShape:
    """The shape Ray and Cloud TPU call `v6e-16`. Ambiguous pod types take the single-host cut,
    as Ray does."""
    version, _, cores = str(pod_type).strip().lower().rpartition("-")
    g = generation(version)
    for s in sorted(shapes(g), key=lambda s: -s.chips_per_host):
        if s.pod_type == f"{g.ray_version}-{cores}":
            return s
    raise CatalogError(f"unknown TPU pod type {pod_type!r}; valid for {g.name}: {', '.join(dict.fromkeys(s.pod_type for s in shapes(g)))}")
