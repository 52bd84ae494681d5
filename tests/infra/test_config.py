"""Environment configs: the shipped ones load, and every bad value fails with one clear line per
field that names it and what would be valid, before anything is built."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from infra.config import ConfigError, environment_names, load_environment, parse_environment

BASE = {
    "name": "t",
    "project": "my-gcp-project",
    "region": "us-east5",
    "zone": "us-east5-b",
    "cluster_name": "ray-tpu-t",
    "slice_groups": [{"name": "v6e-4x4", "generation": "v6e", "topology": "4x4"}],
}


def bad(**changes) -> str:
    data = copy.deepcopy(BASE)
    group = changes.pop("group", None)
    if group is not None:
        data["slice_groups"][0].update(group)
    data.update(changes)
    with pytest.raises(ConfigError) as err:
        parse_environment(data, "bad.yaml")
    return str(err.value)


def test_dev_is_the_reference_v6e_4x4():
    env = load_environment("dev")
    group, serving = env.slice_groups
    assert (group.generation, group.topology, group.slices) == ("v6e", "4x4", 1)
    assert env.serving is not None and env.serving.slice_group == serving.name != group.name
    assert (group.shape.chips, group.shape.hosts, group.shape.machine_type) == (16, 4, "ct6e-standard-4t")
    assert env.zone.startswith(env.region) and env.mode == "standard"
    assert env.stack_name == "ray-tpu-dev"


@pytest.mark.parametrize("name", environment_names())
def test_every_shipped_environment_loads(name):
    assert load_environment(name).name == name


@pytest.mark.parametrize(
    "changes,field,expected",
    [
        (dict(group={"generation": "v9"}), "slice_groups[0].generation", "valid generations: tpu7x, v6e, v5e, v5p, v4"),
        (dict(group={"topology": "3x3"}), "slice_groups[0].topology", "valid topologies: 1x1, 2x2, 2x4, 4x4"),
        (dict(group={"generation": "v5p", "topology": "4x4"}), "slice_groups[0].topology", "valid topologies: 2x2x1, 2x2x2"),
        (dict(group={"topology": "2x4"}), "slice_groups[0].chips_per_host", "choose chips_per_host=8"),
        (dict(group={"chips_per_host": 8}), "slice_groups[0].chips_per_host", "valid chips_per_host: 4"),
        (dict(group={"slices": 0}), "slice_groups[0].slices", "greater than 0"),
        (dict(group={"autoscaling": {"min_slices": -1}}), "slice_groups[0].autoscaling.min_slices", "greater than or equal to 0"),
        (dict(group={"slices": 1, "autoscaling": {"min_slices": 2}}), "slice_groups[0]", "must be between 0 and slices (1)"),
        (dict(group={"capacity": "reservation"}), "slice_groups[0].capacity", "needs its name"),
        (dict(group={"capacity": {"reservation": ""}}), "slice_groups[0].capacity", "{reservation: NAME}"),
        (dict(group={"capacity": "cheap"}), "slice_groups[0].capacity", "valid: on-demand, spot, flex-start"),
        (dict(group={"capacity": "flex-start", "autoscaling": {"min_slices": 1}}), "slice_groups[0]", "min_slices must be 0"),
        (dict(group={"name": "Bad_Name"}), "slice_groups[0].name", "expected lowercase letters, digits and hyphens"),
        (dict(group={"topolgy": "4x4"}), "slice_groups[0].topolgy", "unknown field; valid fields here: name, generation, topology"),
        (dict(slice_groups=[]), "slice_groups", "at least 1 item"),
        (dict(mode="serverless"), "mode", "'standard' or 'autopilot'"),
        (dict(release_channel="NIGHTLY"), "release_channel", "'RAPID', 'REGULAR', 'STABLE' or 'EXTENDED'"),
        (dict(zone="us-west1-a"), "zone", "is not in region 'us-east5'"),
        (dict(project="X"), "project", "is not valid"),
        (dict(network={"pods_cidr": "10.10.0.0/16"}), "network", "overlaps"),
        (dict(network={"master_cidr": "172.16.0.0/24"}), "network.master_cidr", "needs a /28"),
        (dict(cpu_pool={"min_nodes": 5, "max_nodes": 2}), "cpu_pool", "must not exceed max_nodes"),
        (dict(ray={"version": "2.60.0", "image": "rayproject/ray:2.9.0-py311"}), "ray", "does not match version 2.60.0"),
        (dict(netwrk={}), "netwrk", "unknown field; valid fields here: name, project"),
    ],
)
def test_bad_value_names_field_and_choices(changes, field, expected):
    message = bad(**changes)
    line = next((ln for ln in message.splitlines() if ln.strip().startswith(f"- {field}:")), None)
    assert line is not None, f"no line for {field} in:\n{message}"
    assert expected in line, message


def test_duplicate_group_names():
    message = bad(slice_groups=[BASE["slice_groups"][0], BASE["slice_groups"][0]])
    assert "slice_groups: slice group names must be unique; repeated: v6e-4x4" in message


def test_several_bad_fields_give_one_line_each():
    message = bad(mode="x", zone="us-west1-a", group={"topology": "3x3"})
    problems = [ln for ln in message.splitlines() if ln.startswith("  - ")]
    assert len(problems) == 3, message


def test_unknown_environment_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="valid environments: autopilot, dev, prod"):
        load_environment("staging")


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("project: p\nslice_groups: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load_environment(path)


def test_cli_reports_bad_config_without_traceback(tmp_path):
    data = copy.deepcopy(BASE)
    data["slice_groups"][0]["topology"] = "5x5"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "infra", "manifests", "--env", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""  # nothing half-written
    assert "slice_groups[0].topology: '5x5' is not offered for v6e" in proc.stderr
    assert "Traceback" not in proc.stderr
