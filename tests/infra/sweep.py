"""The sweep's environments: every slice shape the catalog offers x every capacity kind the platform
allows for its generation x a fixed and an autoscaled group, one environment per (generation,
capacity), each in a zone that offers it. They are synthesized with the shipped environments in the
session's one cdktf synth (conftest.py) and checked by test_sweep.py against the synthesized JSON
and the printed manifests.

Beside them, `team_environments`: configs a team would write that an earlier reading of the
platform refused (issue 21), synthesized in the same synth and checked by test_team_configs.py.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from infra import catalog
from infra.platform_facts import TPU_ZONES

CAPACITIES = ("on-demand", "spot", "flex-start", "reservation")


def capacity_value(kind: str):
    return {"reservation": "sweep-res"} if kind == "reservation" else kind


def zone_for(generation: str, capacity: str) -> str | None:
    """The first zone Google lists for the generation (flex-start's own list for flex-start); None
    where the platform does not offer that capacity for the generation."""
    facts = TPU_ZONES[generation]
    zones = (facts.flex_start or ()) if capacity == "flex-start" else facts.zones
    return zones[0] if zones else None


def sweep_environments() -> dict[str, dict]:
    """{file stem: config data} for every (generation, capacity) the platform offers."""
    out = {}
    for gen in catalog.GENERATIONS:
        for kind in CAPACITIES:
            zone = zone_for(gen.name, kind)
            if zone is None:
                continue
            groups = []
            for i, s in enumerate(catalog.shapes(gen)):
                base = {"generation": gen.name, "topology": s.topology, "capacity": capacity_value(kind)}
                if gen.chips_per_host_options(s.topology)[1:]:
                    base["chips_per_host"] = s.chips_per_host
                if kind != "flex-start":  # flex-start always scales from zero
                    groups.append({"name": f"s{i}-fixed", **base})
                groups.append({"name": f"s{i}-auto", **base, "autoscaling": {"min_slices": 0}})
            name = f"sweep-{gen.name}-{kind}"
            out[name] = {
                "name": name,
                "project": "my-gcp-project",
                "region": zone.rsplit("-", 1)[0],
                "zone": zone,
                "cluster_name": f"sw-{gen.name}-{kind}"[:30],
                "gke_min_version": "1.35",
                "state_bucket": "my-gcp-project-tfstate",
                "slice_groups": groups,
            }
    return out


def write_environments(directory: Path, environments: dict[str, dict]) -> list[Path]:
    """Each environment as `<directory>/<name>.yaml`, as a user would write it."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in environments.items():
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        paths.append(path)
    return paths


def write_sweep(directory: Path) -> list[Path]:
    return write_environments(directory, sweep_environments())


def _team(name: str, region: str, zone: str, groups: list[dict], **extra) -> dict:
    return {
        "name": name,
        "project": "my-gcp-project",
        "region": region,
        "zone": zone,
        "cluster_name": name,
        "gke_min_version": "1.35",
        "slice_groups": groups,
        **extra,
    }


# A pod memory request the older reading refused (machine memory taken as 10^9 bytes, allocatable
# 650.3 GiB on a ct6e-standard-4t) and the corrected one accepts (GiB, the kubelet's capacity at 97%:
# 677.6 GiB allocatable).
BIG_POD_MEMORY = "670Gi"
SHARED_RESERVATION = "projects/owner-project/reservations/ironwood-res/reservationBlocks/block-1"


def team_environments() -> dict[str, dict]:
    """{file stem: config data}: TPU7x on flex-start, a reservation shared from another project (on
    Standard and on Autopilot), a zonal cluster with a pool in a sibling zone, a v5p reservation in
    a zone Google's public list omits, and pods asking for nearly all of a node's memory."""
    v6e = {"generation": "v6e", "topology": "4x4"}
    ironwood = {"generation": "tpu7x", "topology": "2x2x2"}
    envs = [
        _team("team-tpu7x-flex", "us-central1", "us-central1-c", [{"name": "ironwood", **ironwood, "capacity": "flex-start"}]),
        _team(
            "team-shared-res",
            "us-central1",
            "us-central1-c",
            [{"name": "ironwood", **ironwood, "capacity": {"reservation": SHARED_RESERVATION}}],
        ),
        _team(
            "team-shared-res-ap",
            "us-east5",
            "us-east5-b",
            [{"name": "trillium", **v6e, "capacity": {"reservation": "projects/owner-project/reservations/trillium-res"}}],
            mode="autopilot",
        ),
        _team("team-zonal-sibling", "us-east5", "us-east5-b", [{"name": "trillium", **v6e, "zone": "us-east5-a"}]),
        _team(
            "team-v5p-reserved",
            "us-east5",
            "us-east5-b",
            [{"name": "v5p", "generation": "v5p", "topology": "2x2x2", "capacity": {"reservation": "v5p-res"}}],
        ),
        _team("team-big-pods", "us-east5", "us-east5-b", [{"name": "trillium", **v6e, "pod_cpu": "160", "pod_memory": BIG_POD_MEMORY}]),
        # Kueue with queued provisioning (GKE's ray-kueue-dws tutorial: a v6e 4x4 RayJob).
        _team(
            "team-queued",
            "us-east5",
            "us-east5-b",
            [
                {"name": "dws", **v6e, "slices": 2, "capacity": "queued-provisioning", "rayjob_slices": 2},
                {"name": "trillium", **v6e, "rayjob_slices": 1, "slices": 2},
            ],
            kueue={"local_queue": "team-a"},
        ),
        # RayJobs as a team writes them (issue 32): pod memory in decimal units on single-host slices,
        # a DWS group, and two groups for jobs, with priorities of its own.
        _team(
            "team-rayjobs",
            "us-east5",
            "us-east5-b",
            [
                {
                    "name": "hosts",
                    "generation": "v6e",
                    "topology": "2x2",
                    "slices": 2,
                    "rayjob_slices": 2,
                    "pod_cpu": "150",
                    "pod_memory": "600G",
                },
                {"name": "dws", **v6e, "zone": "us-east5-a", "slices": 2, "capacity": "queued-provisioning", "rayjob_slices": 2},
                {"name": "v5p", "generation": "v5p", "topology": "2x2x2", "zone": "us-east5-a", "rayjob_slices": 1},
            ],
            kueue={"local_queue": "team-jobs", "priorities": {"batch": 10, "deadline": 1000}, "default_priority": "batch"},
        ),
    ]
    return {e["name"]: e for e in envs}


def write_team(directory: Path) -> list[Path]:
    return write_environments(directory, team_environments())
