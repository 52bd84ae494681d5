"""Property-based fuzz of the config loader: whatever a YAML file holds, loading it either gives
a valid Environment or a ConfigError whose every line names a field. Never another exception."""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import ENVIRONMENTS_DIR, ConfigError, Environment, load_environment, parse_environment

DEV = yaml.safe_load((ENVIRONMENTS_DIR / "dev.yaml").read_text())

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["v6e", "4x4", "2x4", "spot", "reservation", "tpu7x", "2x2x2", "-1", "0"]),
)
values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=6
)


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


ALL_PATHS = [p for p in paths(DEV) if p]


def mutate(data, path, value):
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(ALL_PATHS), values), min_size=1, max_size=4))
def test_mutated_dev_config_loads_or_fails_cleanly(mutations):
    data = copy.deepcopy(DEV)
    data["name"] = "fuzz"
    for path, value in mutations:
        try:
            mutate(data, path, value)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation replaced a parent: nothing to set
    try:
        env = parse_environment(data, "fuzz.yaml")
    except ConfigError as err:
        lines = str(err).splitlines()
        assert lines[0] == "fuzz.yaml is not a valid environment config:"
        assert len(lines) >= 2 and all(ln.startswith("  - ") and len(ln) > 6 for ln in lines[1:])
    else:
        assert isinstance(env, Environment)
        for group in env.slice_groups:  # a config that loads has shapes the catalog knows
            assert group.shape.hosts * group.shape.chips_per_host == group.shape.chips


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_file_text_loads_or_fails_cleanly(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "any.yaml"
    path.write_text(text)
    try:
        load_environment(path)
    except ConfigError as err:
        assert str(err).startswith(f"{path} is not a valid environment config:")
