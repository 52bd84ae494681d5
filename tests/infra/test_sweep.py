"""Every shape the catalog offers x every capacity kind x fixed and autoscaled (tests/infra/sweep.py),
synthesized in the session's one cdktf synth and printed by `python -m infra manifests`: every node
pool and worker group obeys the platform's rules. The checks read only what users get (the
synthesized JSON, the printed YAML) and the config files, never our own plans."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from infra import catalog, rules
from infra.platform_facts import BOOT_DISK_TYPES

pytestmark = pytest.mark.synth

REPO = Path(__file__).resolve().parents[2]
LABEL = "ray-tpu-gke/slice-group"


def config_groups(path: Path) -> dict[str, dict]:
    return {g["name"]: g for g in yaml.safe_load(path.read_text())["slice_groups"]}


def shape_of(group: dict) -> catalog.SliceShape:
    return catalog.shape(group["generation"], group["topology"], group.get("chips_per_host"))


def kind_of(group: dict) -> str:
    capacity = group.get("capacity", "on-demand")
    return "reservation" if isinstance(capacity, dict) else capacity


@pytest.fixture(scope="module")
def printed(sweep_paths) -> dict[str, list[dict]]:
    def run(path: Path) -> tuple[str, list[dict]]:
        proc = subprocess.run(
            [sys.executable, "-m", "infra", "manifests", "--env", str(path)], cwd=REPO, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return path.stem, list(yaml.load_all(proc.stdout, Loader=yaml.CSafeLoader))

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(run, sweep_paths))


def test_the_sweep_covers_every_shape_and_capacity(sweep_paths):
    covered: dict[tuple[str, str], set] = {}
    for path in sweep_paths:
        for group in config_groups(path).values():
            s = shape_of(group)
            covered.setdefault((group["generation"], kind_of(group)), set()).add((s.topology, s.chips_per_host, "autoscaling" in group))
    for gen in catalog.GENERATIONS:
        shapes = {(s.topology, s.chips_per_host) for s in catalog.shapes(gen)}
        for kind in ("on-demand", "spot", "reservation"):
            assert covered[(gen.name, kind)] == {(t, c, a) for t, c in shapes for a in (False, True)}, (gen.name, kind)
        if gen.name in ("v6e", "v5e", "v5p", "tpu7x"):  # GKE's flex-start generations (TPU7x: cluster-toolkit's blueprint)
            assert covered[(gen.name, "flex-start")] == {(t, c, True) for t, c in shapes}


def test_every_synthesized_pool_obeys_the_rules(sweep_stacks, sweep_paths):
    total = 0
    for path in sweep_paths:
        stack = sweep_stacks[path.stem]
        env = stack.env
        groups = config_groups(path)
        pools = [p for p in stack.resources("google_container_node_pool").values() if p["name"] != "cpu"]
        expected = sum(shape_of(g).hosts > 1 and g.get("slices", 1) or 1 for g in groups.values())
        assert len(pools) == expected, path.stem
        for pool in pools:
            total += 1
            group = groups[pool["node_config"]["labels"][LABEL]]
            s, kind, where = shape_of(group), kind_of(group), f"{path.stem}/{pool['name']}"
            # One count only: the provider refuses both (expandNodePool, provider 6.50.0).
            assert not (pool.get("initial_node_count") and pool.get("node_count")), where
            assert pool["node_config"]["machine_type"] == s.machine_type, where
            assert pool["location"] == env.location and pool["node_locations"] == [env.zone], where
            assert rules.zone_offers(s.generation.name, env.zone, kind) is None, where
            size = s.hosts if s.multi_host else group.get("slices", 1)
            if "autoscaling" in group or kind == "flex-start":
                assert pool["autoscaling"]["min_node_count"] == 0 and pool["autoscaling"]["max_node_count"] == size, where
                assert "node_count" not in pool, where
            else:
                assert pool["node_count"] == size and "autoscaling" not in pool and "initial_node_count" not in pool, where
            config = pool["node_config"]
            assert config.get("spot", False) == (kind == "spot"), where
            assert config.get("flex_start", False) == (kind == "flex-start"), where
            assert pool["management"]["auto_repair"] == (kind != "flex-start"), where  # xpk, cluster-toolkit
            if kind == "reservation":
                assert config["reservation_affinity"]["consume_reservation_type"] == "SPECIFIC_RESERVATION", where
            elif kind == "flex-start":
                assert config["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}, where
            assert "queued_provisioning" not in pool, where
            placement = pool.get("placement_policy")
            if not s.multi_host:
                assert placement is None, where
            elif s.generation.name == "tpu7x":
                assert placement["policy_name"].startswith("${google_compute_resource_policy.") and "tpu_topology" not in placement, where
                assert placement["type"] == "", where  # a workload policy alone (tpu_node_pools.py says why)
            else:
                assert placement == {"type": "COMPACT", "tpu_topology": s.topology}, where
            assert config.get("disk_type") == BOOT_DISK_TYPES.get(s.generation.name), where
    assert total > 10_000  # every shape x capacity x fixed/autoscaled


def test_every_printed_worker_group_fits_and_selects_only_its_own_pools(printed, sweep_stacks, sweep_paths):
    for path in sweep_paths:
        docs = printed[path.stem]
        (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
        groups = config_groups(path)
        pools = [p for p in sweep_stacks[path.stem].resources("google_container_node_pool").values() if p["name"] != "cpu"]
        by_label: dict[str, list[dict]] = {}
        for pool in pools:
            by_label.setdefault(pool["node_config"]["labels"][LABEL], []).append(pool)
        names = [w["groupName"] for w in cluster["spec"]["workerGroupSpecs"]]
        assert len(names) == len(set(names)) == len(groups), path.stem
        for worker in cluster["spec"]["workerGroupSpecs"]:
            group = groups[worker["groupName"]]
            s = shape_of(group)
            pod = worker["template"]["spec"]
            (container,) = pod["containers"]
            requests = container["resources"]["requests"]
            where = f"{path.stem}/{worker['groupName']}"
            assert pod["nodeSelector"] == {
                "cloud.google.com/gke-tpu-accelerator": s.generation.gke_accelerator,
                "cloud.google.com/gke-tpu-topology": s.topology,
                LABEL: worker["groupName"],
            }, where
            assert worker["numOfHosts"] == s.hosts and requests["google.com/tpu"] == str(s.chips_per_host), where
            assert rules.requests_fit(s.machine_type, requests["cpu"], requests["memory"]) == {}, where
            # The pools it can land on are its group's alone, each of a machine with exactly the
            # chips a pod asks for: a 2-host 2x4 never lands on one 8-chip node.
            selected = by_label[worker["groupName"]]
            assert selected and {p["node_config"]["machine_type"] for p in selected} == {s.machine_type}, where
