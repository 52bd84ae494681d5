"""The shared flags: config-driven defaults, catalog validation, and exit 2 with one paragraph
naming the flag and the valid choices (no traceback). No cluster needed: arguments are checked
before anything connects to Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra import catalog
from infra.config import load_environment
from jobs import REPO_ROOT, cli, healthcheck
from jobs.local import __main__ as local_cli
from jobs.train import __main__ as train


def resolve(argv, reserve_timeout=True):
    parser = cli.JobArgumentParser(prog="job")
    cli.add_slice_flags(parser, reserve_timeout=reserve_timeout)
    return cli.parse(parser, argv)[1]


def bad(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err  # one paragraph
    return err


def test_defaults_come_from_the_environment_configs_first_slice_group():
    env = load_environment("dev")
    group = env.slice_groups[0]
    target = resolve([])
    assert target.shape == group.shape
    assert target.slices == group.slices
    assert target.bucket_name == env.bucket_name
    assert target.reserve_timeout_s == cli.DEFAULT_RESERVE_TIMEOUT_S >= 600  # room for a scale-up from zero
    assert target.hosts == group.shape.hosts * group.slices


def test_explicit_flags_win_and_aliases_resolve():
    target = resolve(["--generation", "trillium", "--topology", "8x8", "--slices", "2", "--reserve-timeout", "90"])
    assert target.shape == catalog.shape("v6e", "8x8")
    assert (target.slices, target.reserve_timeout_s, target.hosts) == (2, 90.0, 32)
    assert resolve(["--generation", "v6e", "--topology", "2x4", "--chips-per-host", "4"]).shape.hosts == 2


@pytest.mark.parametrize(
    "argv, flag, choices",
    [
        (["--generation", "v9"], "--generation", "valid generations: tpu7x, v6e, v5e, v5p, v4"),
        (["--generation", "v5p"], "--topology", "valid topologies: 2x2x1, 2x2x2"),  # dev's 4x4 is 2-D
        (["--topology", "3x3"], "--topology", "valid topologies: 1x1, 2x2, 2x4, 4x4"),
        (["--topology", "2x4"], "--chips-per-host", "choose chips_per_host=8"),
        (["--reserve-timeout", "-5"], "--reserve-timeout", "positive number of seconds"),
        (["--reserve-timeout", "soon"], "--reserve-timeout", "positive number of seconds"),
        (["--slices", "0"], "--slices", "use 1 or more"),
        (["--env", "nope"], "--env", "valid environments: autopilot, dev, prod"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag_and_the_choices(argv, flag, choices, capsys):
    for main in (healthcheck.main, train.main):
        err = bad(main, argv, capsys)
        assert flag in err and choices in err, err


def test_train_checks_its_own_flags_against_the_slice(capsys):
    err = bad(train.main, ["--batch-size", "10"], capsys)
    assert "--batch-size" in err and "multiple of the 16 chips" in err
    err = bad(train.main, ["--fsdp", "3"], capsys)
    assert "--fsdp" in err and "divide the 16 chips of a slice" in err
    err = bad(train.main, ["--d-model", "30", "--heads", "4"], capsys)
    assert "--heads" in err
    err = bad(train.main, ["--heads", "4", "--kv-heads", "3"], capsys)
    assert "argument --kv-heads" in err and "multiple of n_kv_heads" in err
    err = bad(train.main, ["--preset", "70b"], capsys)
    assert "argument --preset" in err and "'tiny', '125m', '1b', '8b'" in err


def test_train_presets_and_shape_flags():
    from jobs.train import parse_config
    from jobs.train.model import PRESETS, ModelConfig

    def model(*argv: str) -> ModelConfig:
        _, config, *_ = parse_config(["--generation", "v6e", "--topology", "4x4", "--storage", "/tmp/x", *argv])
        return ModelConfig(**config.model)

    assert model() == PRESETS["tiny"]
    assert model("--preset", "8b") == PRESETS["8b"]
    assert model("--preset", "1b", "--layers", "2", "--seq-len", "128") == ModelConfig(
        **{**PRESETS["1b"].to_dict(), "n_layers": 2, "seq_len": 128}
    )
    _, config, *_ = parse_config(["--generation", "v6e", "--topology", "4x4", "--storage", "/tmp/x"])
    assert config.fsdp == 16  # every chip of the slice


def test_local_up_validates_the_same_flags(capsys):
    err = bad(local_cli.main, ["up", "--generation", "v9"], capsys)
    assert "--generation" in err


def test_a_real_entrypoint_exits_2_without_a_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "jobs.healthcheck", "--generation", "v6e", "--topology", "5x5"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "--topology" in done.stderr and "valid topologies" in done.stderr


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1, max_size=12).filter(lambda s: s.strip() and not s.startswith("-")))
def test_any_unknown_generation_is_a_clean_usage_error(name):
    try:
        catalog.generation(name)
    except catalog.CatalogError:
        pass
    else:
        return  # a real name or alias
    parser = cli.JobArgumentParser(prog="job")
    cli.add_slice_flags(parser)
    with pytest.raises(SystemExit) as caught:
        cli.parse(parser, ["--generation", name])
    assert caught.value.code == 2
