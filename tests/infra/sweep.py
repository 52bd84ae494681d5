"""The sweep's environments: every slice shape the catalog offers x every capacity kind the platform
allows for its generation x a fixed and an autoscaled group, one environment per (generation,
capacity), each in a zone that offers it. They are synthesized with the shipped environments in the
session's one cdktf synth (conftest.py) and checked by test_sweep.py against the synthesized JSON
and the printed manifests.
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


def write_sweep(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in sweep_environments().items():
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        paths.append(path)
    return paths
