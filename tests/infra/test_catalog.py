"""The TPU catalog against Google's published table and against Ray's own topology tables."""

from __future__ import annotations

import pytest

from infra import catalog

# Google's table (cloud.google.com TPU docs; hosts = VMs): (generation, topology, chips, hosts,
# chips per host, machine type, Ray pod type).
GOOGLE_TABLE = [
    ("v6e", "1x1", 1, 1, 1, "ct6e-standard-1t", "v6e-1"),
    ("v6e", "2x2", 4, 1, 4, "ct6e-standard-4t", "v6e-4"),
    ("v6e", "4x4", 16, 4, 4, "ct6e-standard-4t", "v6e-16"),
    ("v6e", "4x8", 32, 8, 4, "ct6e-standard-4t", "v6e-32"),
    ("v6e", "8x8", 64, 16, 4, "ct6e-standard-4t", "v6e-64"),
    ("v6e", "8x16", 128, 32, 4, "ct6e-standard-4t", "v6e-128"),
    ("v6e", "16x16", 256, 64, 4, "ct6e-standard-4t", "v6e-256"),
    ("v5e", "1x1", 1, 1, 1, "ct5lp-hightpu-1t", "v5litepod-1"),
    ("v5e", "2x2", 4, 1, 4, "ct5lp-hightpu-4t", "v5litepod-4"),
    ("v5e", "4x4", 16, 4, 4, "ct5lp-hightpu-4t", "v5litepod-16"),
    ("v5e", "16x16", 256, 64, 4, "ct5lp-hightpu-4t", "v5litepod-256"),
    ("v5p", "2x2x1", 4, 1, 4, "ct5p-hightpu-4t", "v5p-8"),
    ("v5p", "2x2x2", 8, 2, 4, "ct5p-hightpu-4t", "v5p-16"),
    ("v5p", "2x2x4", 16, 4, 4, "ct5p-hightpu-4t", "v5p-32"),
    ("v5p", "2x4x4", 32, 8, 4, "ct5p-hightpu-4t", "v5p-64"),
    ("v5p", "4x4x4", 64, 16, 4, "ct5p-hightpu-4t", "v5p-128"),
    ("v4", "2x2x1", 4, 1, 4, "ct4p-hightpu-4t", "v4-8"),
    ("v4", "2x2x2", 8, 2, 4, "ct4p-hightpu-4t", "v4-16"),
    ("v4", "2x2x4", 16, 4, 4, "ct4p-hightpu-4t", "v4-32"),
    ("v4", "4x4x4", 64, 16, 4, "ct4p-hightpu-4t", "v4-128"),
    ("tpu7x", "2x2x1", 4, 1, 4, "tpu7x-standard-4t", "v7x-8"),
    ("tpu7x", "2x2x2", 8, 2, 4, "tpu7x-standard-4t", "v7x-16"),
    ("tpu7x", "4x4x4", 64, 16, 4, "tpu7x-standard-4t", "v7x-128"),
    ("tpu7x", "8x16x16", 2048, 512, 4, "tpu7x-standard-4t", "v7x-4096"),
]


@pytest.mark.parametrize("gen,topology,chips,hosts,per_host,machine,pod_type", GOOGLE_TABLE)
def test_shape_matches_google_table(gen, topology, chips, hosts, per_host, machine, pod_type):
    s = catalog.shape(gen, topology)
    assert (s.chips, s.hosts, s.chips_per_host, s.machine_type, s.pod_type) == (chips, hosts, per_host, machine, pod_type)
    assert s.multi_host == (hosts > 1)


def test_reference_slice_is_16_chips_on_4_hosts():
    s = catalog.shape("v6e", "4x4")
    assert (s.chips, s.hosts, s.chips_per_host, s.machine_type) == (16, 4, 4, "ct6e-standard-4t")
    assert s.generation.gke_accelerator == "tpu-v6e-slice"
    assert s.generation.ray_accelerator_type == "TPU-V6E"


@pytest.mark.parametrize(
    "gen,label,tflops,hbm_gb",
    [
        ("tpu7x", "tpu7x", 2307, 192 * 2**30 / 1e9),
        ("v6e", "tpu-v6e-slice", 918, 32),
        ("v5e", "tpu-v5-lite-podslice", 197, 16),
        ("v5p", "tpu-v5p-slice", 459, 95),
        ("v4", "tpu-v4-podslice", 275, 32 * 2**30 / 1e9),
    ],  # Cloud TPU "TPU v4": "32 GiB"
)
def test_generation_facts(gen, label, tflops, hbm_gb):
    g = catalog.generation(gen)
    assert g.gke_accelerator == label
    assert g.peak_bf16_flops_per_chip == pytest.approx(tflops * 1e12)
    assert g.hbm_bytes_per_chip / 1e9 == pytest.approx(hbm_gb)


def test_two_by_four_is_ambiguous_until_chosen():
    for gen, big, small in (("v6e", "ct6e-standard-8t", "ct6e-standard-4t"), ("v5e", "ct5lp-hightpu-8t", "ct5lp-hightpu-4t")):
        with pytest.raises(catalog.CatalogError, match="ambiguous: choose chips_per_host=8 .* or chips_per_host=4"):
            catalog.shape(gen, "2x4")
        one, two = catalog.shape(gen, "2x4", 8), catalog.shape(gen, "2x4", 4)
        assert (one.hosts, one.machine_type) == (1, big)
        assert (two.hosts, two.machine_type) == (2, small)
        assert one.pod_type == two.pod_type


def test_aliases_and_labels_name_the_same_generation():
    assert catalog.generation("Ironwood") is catalog.generation("v7x") is catalog.generation("tpu7x")
    assert catalog.generation("tpu-v5-lite-podslice") is catalog.generation("v5litepod") is catalog.generation("v5e")


def test_unknown_generation_lists_valid_ones():
    with pytest.raises(catalog.CatalogError) as err:
        catalog.generation("v9")
    assert "valid generations: tpu7x, v6e, v5e, v5p, v4" in str(err.value)


def test_unknown_topology_lists_valid_ones():
    with pytest.raises(catalog.CatalogError) as err:
        catalog.shape("v6e", "3x3")
    assert "'3x3' is not offered for v6e" in str(err.value)
    assert "4x4" in str(err.value) and "16x16" in str(err.value)


def test_wrong_chips_per_host_is_refused():
    with pytest.raises(catalog.CatalogError, match="valid chips_per_host: 4"):
        catalog.shape("v6e", "4x4", 8)


def test_pod_type_round_trips():
    # A pod type names a chip count: v4's permuted shapes (4x8x4, 8x4x4) share one, as in Ray.
    for s in catalog.shapes():
        back = catalog.shape_for_pod_type(s.pod_type)
        assert (back.generation, back.chips, back.pod_type) == (s.generation, s.chips, s.pod_type)


# Every shape GKE offers, by xpk's generator (AI-Hypercomputer/xpk@367c838
# src/xpk/core/system_characteristics.py, read 2026-12-03): tpu7x-standard-4t 432 topologies
# (max_cubes 144, plus 1x1x1 on tpu7x-standard-1t), v5p 414 (max 140), v4 800 (max 64, permutations).
@pytest.mark.parametrize(
    "gen,count,samples",
    [
        ("tpu7x", 433, ["1x1x1", "2x2x1", "4x4x4", "4x4x12", "8x16x16", "20x20x20"]),
        ("v5p", 414, ["2x2x1", "16x16x24", "20x20x20", "4x8x256"]),
        ("v4", 800, ["2x2x1", "4x8x4", "256x4x4", "8x8x16"]),
        ("v6e", 8, ["1x1", "16x16"]),
    ],
)
def test_every_shape_xpk_offers(gen, count, samples):
    g = catalog.generation(gen)
    assert len(g.topologies) == count
    assert all(g.offers(t) for t in samples)
    assert not g.offers("4x4x260") and not g.offers("24x24x24")  # past 256, or more cubes than a pod


def test_megacore_and_dual_core_devices():
    assert catalog.shape("v5p", "2x2x2").jax_devices == 8  # megacore: one device per chip
    assert catalog.shape("tpu7x", "2x2x2").jax_devices == 16  # each TensorCore is a device


# --- agreement with Ray's own tables (where Ray is installed) ------------------------------------


@pytest.fixture(scope="module")
def ray_tpu():
    return pytest.importorskip("ray._private.accelerators.tpu")


def test_ray_topology_table_is_the_installed_one(ray_tpu):
    import ray

    from infra.platform_facts import RAY_TPU_TOPOLOGIES, RAY_VERSION_READ

    assert ray.__version__ == RAY_VERSION_READ
    for g in catalog.GENERATIONS:
        assert RAY_TPU_TOPOLOGIES[g.name] == set(ray_tpu.VALID_TPU_TOPOLOGY[g.ray_version]), g.name


RAY_SHAPES = [
    s for s in catalog.shapes() if s.topology in __import__("infra.platform_facts").platform_facts.RAY_TPU_TOPOLOGIES[s.generation.name]
]


@pytest.mark.parametrize("s", RAY_SHAPES, ids=lambda s: f"{s.generation.name}-{s.topology}-{s.chips_per_host}")
def test_catalog_agrees_with_ray(ray_tpu, s):
    # Where Ray knows a shape GKE offers, both say the same of it.
    version = s.generation.ray_version
    assert version in ray_tpu.VALID_TPU_TYPES
    assert s.topology in ray_tpu.VALID_TPU_TOPOLOGY[version], f"Ray does not know {version} {s.topology}"
    assert ray_tpu.get_num_chips_from_topology(s.topology) == s.chips
    assert ray_tpu.infer_tpu_pod_type_from_topology(s.topology, s.generation.ray_accelerator_type) == s.pod_type
    assert ray_tpu.get_tpu_cores_per_chip(s.pod_type) == s.generation.tensorcores_per_chip
    # Ray's default cut of a shape into hosts is one of ours, and the one we take for ambiguous shapes.
    ray_default = ray_tpu.get_chips_per_host(s.topology, version)
    assert ray_default in s.generation.chips_per_host_options(s.topology)
    assert ray_default == catalog.shape_for_pod_type(s.pod_type).chips_per_host


def test_ray_accelerator_type_names_exist(ray_tpu):
    from ray.util import accelerators

    names = {v for k, v in vars(accelerators).items() if k.startswith("GOOGLE_TPU_")}
    for g in catalog.GENERATIONS:
        assert g.ray_accelerator_type in names
