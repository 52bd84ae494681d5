"""Bad input at every command-line entry point: broken environment configs and bad job arguments.

Each row runs a real entry point (`python -m infra show|manifests`, `python -m infra.doctor`, the
cdktf app `python -m infra.app` with RAY_TPU_ENVS, `python -m jobs.healthcheck|train|submit|demo`,
`python -m jobs.local up`) as a subprocess and checks the four properties the project promises:

  1. it exits non-zero;
  2. its message names the field or flag (and the valid choices, where the code lists them), in the
     entry point's own format: one line, a header plus one bullet per bad field, or argparse's usage
     block plus one error line;
  3. no traceback, on either stream;
  4. it writes nothing: its cwd, HOME, RAY_TMPDIR and TMPDIR (fresh empty directories) stay empty,
     and the repo gains no file (`git status` and a listing of the tree, gitignored outputs such as
     build/ and cdktf.out/ included, are the same before and after the whole sweep).

Every bad config (unknown topology or generation, negative slices, bad CIDR, bad project id, YAML
syntax error, unknown top-level key, missing file, non-UTF-8 file, unknown environment name) goes to
every entry point; each bad flag goes to the entry points that have it.

Nothing can reach a cloud or a cluster: PATH is an empty directory (no gcloud, no kubectl), the doctor
gets a loopback --endpoint, and RAY_ADDRESS is a malformed address that `ray.init` rejects at once,
so a row whose arguments were wrongly accepted fails fast instead of joining a cluster on this
machine. The rows run in parallel: about 15 s for the whole sweep on an idle 2-core machine.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEV = yaml.safe_load((REPO / "infra" / "environments" / "dev.yaml").read_text())

ROW_TIMEOUT_S = 90  # one row normally takes 0.3-2 s; this only bounds a hang
GUARD_RAY_ADDRESS = "no-ray-for-the-bad-input-sweep"  # ray.init: "Invalid address format", at once
GUARD_ENDPOINT = "http://127.0.0.1:9"  # the discard port: nothing listens, nothing leaves the host
# Where the repo's tree is listed for new files: caches that test runs write are not outputs.
UNLISTED = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", ".hypothesis"}

# Placeholders in a row's argv, env and expectations, filled in by the sweep fixture.
CONFIG = "<config>"  # the bad config's --env value (a path, or a name)
SOURCE = "<source>"  # how the config error names it: the path, or "environment 'NAME'"
A_FILE = "<a-file>"  # an existing regular file (outside every checked directory)
LONG_DIR = "<long-dir>"  # a path too long for Ray's unix sockets


# --- the bad configs -----------------------------------------------------------------------------


def _dev(change) -> str:
    data = copy.deepcopy(DEV)
    change(data)
    return yaml.safe_dump(data, sort_keys=False)


@dataclass(frozen=True)
class BadConfig:
    name: str  # also the file's stem: the loader takes an environment's name from it
    content: str | bytes | None  # None: no file at all (a path, or a name, that does not exist)
    problem: tuple[str, ...]  # the bullet names the field, says what is wrong and what is valid
    env_name: str | None = None  # --env NAME instead of a path


BAD_CONFIGS = [
    BadConfig(
        "unknown-topology",
        _dev(lambda d: d["slice_groups"][0].update(topology="4x5")),
        ("slice_groups[0].topology: '4x5' is not offered for v6e; valid topologies: 1x1, 2x2, 2x4, 4x4",),
    ),
    BadConfig(
        "unknown-generation",
        _dev(lambda d: d["slice_groups"][0].update(generation="v9")),
        ("slice_groups[0].generation: unknown TPU generation 'v9'; valid generations: tpu7x, v6e, v5e, v5p, v4",),
    ),
    BadConfig(
        "negative-slices",
        _dev(lambda d: d["slice_groups"][0].update(slices=-1)),
        ("slice_groups[0].slices: Input should be greater than 0",),
    ),
    BadConfig(
        "bad-cidr",
        _dev(lambda d: d["network"].update(subnet_cidr="10.10.0.0/33")),
        ("network.subnet_cidr: '10.10.0.0/33' is not a CIDR range (", "); write it like 10.10.0.0/20"),
    ),
    BadConfig(
        "bad-project-id",
        _dev(lambda d: d.update(project="My_Project")),
        ("project: 'My_Project' is not valid: expected a GCP project id (6-30 lowercase letters, digits and hyphens)",),
    ),
    BadConfig("yaml-syntax-error", "project: p\nslice_groups: [\n", ("not valid YAML at line 3, column 1: ",)),
    BadConfig(
        "unknown-top-level-key",
        _dev(lambda d: d.update(netwrk={})),
        ("netwrk: unknown field; valid fields here: name, project, region, zone, cluster_name, mode,",),
    ),
    BadConfig("missing-file", None, ("file not found",)),
    BadConfig("not-utf8", b"project: caf\xe9\n", ("not UTF-8 text: byte 0xe9 at offset 12 (",)),
    BadConfig(
        "unknown-env-name",
        None,
        ("unknown environment; valid environments: autopilot, dev, prod, or a path to a .yaml file",),
        env_name="staging",
    ),
]


# --- the rows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]  # after `python`
    kind: str  # "line": one line; "report": header + one bullet; "usage": argparse usage + one line
    first: str  # the error line starts with this (for "report": the header line, exactly)
    expect: tuple[str, ...]  # the error line (for "report": the bullet) contains each of these
    end: str = ""  # ...and ends with this
    env: dict[str, str] = field(default_factory=dict)
    config: BadConfig | None = None
    xfail: str | None = None


def _job_error(prog: str, flag_message: str, *expect: str) -> dict:
    """The shared parser's format (jobs/cli.py JobArgumentParser): one line, `(see PROG --help)`."""
    return dict(kind="line", first=f"{prog}: error: {flag_message}", expect=expect, end=f" (see {prog} --help)")


HEALTHCHECK, TRAIN, LOCAL, LOCAL_UP, SUBMIT, DEMO = (
    f"python -m jobs.{m}" for m in ("healthcheck", "train", "local", "local up", "submit", "demo")
)
DOCTOR, INFRA = "python -m infra.doctor", "python -m infra"


def _config_rows() -> list[Row]:
    """Every bad config through every entry point that reads one."""
    # The infra entry points, the cdktf app and jobs.submit print the ConfigError as it is:
    # `error: SOURCE is not a valid environment config:` and one `  - field: ...` line per problem.
    report = dict(kind="report", first=f"error: {SOURCE} is not a valid environment config:")
    entry_points = {
        "infra-show": (("-m", "infra", "show", "--env", CONFIG), {}, report),
        "infra-manifests": (("-m", "infra", "manifests", "--env", CONFIG), {}, report),
        "infra-doctor": (("-m", "infra.doctor", "--env", CONFIG, "--endpoint", GUARD_ENDPOINT), {}, report),
        "cdktf-app": (("-m", "infra.app"), {"RAY_TPU_ENVS": CONFIG}, report),
        "submit": (("-m", "jobs.submit", "healthcheck", "--env", CONFIG), {}, report),
        # The jobs fold it into their one-line usage error for --env.
        **{
            name: (
                argv,
                {},
                dict(
                    kind="line",
                    first=f"{prog}: error: argument --env: {CONFIG!r}: {SOURCE} is not a valid environment config: - ",
                    end=f" (see {prog} --help)",
                ),
            )
            for name, argv, prog in (
                ("healthcheck", ("-m", "jobs.healthcheck", "--env", CONFIG), HEALTHCHECK),
                ("train", ("-m", "jobs.train", "--env", CONFIG), TRAIN),
                # resolve_target reports through the top-level parser, hence `jobs.local`, not `up`
                ("local-up", ("-m", "jobs.local", "up", "--env", CONFIG), LOCAL),
                ("demo", ("-m", "jobs.demo", "--env", CONFIG), DEMO),
            )
        },
    }
    return [
        Row(f"{entry}-config-{bad.name}", argv, env=env, config=bad, expect=bad.problem, **fmt)
        for bad in BAD_CONFIGS
        for entry, (argv, env, fmt) in entry_points.items()
    ]


NOT_POSITIVE = "is not allowed; use a positive number of seconds"
V6E_TOPOLOGIES = "valid topologies: 1x1, 2x2, 2x4, 4x4, 4x8"

ARG_ROWS = [
    # jobs.healthcheck: the slice flags, its own flags and the fault flags
    Row(
        "healthcheck-unknown-topology",
        ("-m", "jobs.healthcheck", "--topology", "9x9"),
        **_job_error(HEALTHCHECK, "argument --topology: '9x9' is not offered for v6e; ", V6E_TOPOLOGIES),
    ),
    Row(
        "healthcheck-unknown-generation",
        ("-m", "jobs.healthcheck", "--generation", "v9"),
        **_job_error(HEALTHCHECK, "argument --generation: unknown TPU generation 'v9'; ", "valid generations: tpu7x, v6e, v5e, v5p, v4"),
    ),
    Row(
        "healthcheck-chips-per-host-3",
        ("-m", "jobs.healthcheck", "--chips-per-host", "3"),
        **_job_error(HEALTHCHECK, "argument --chips-per-host: v6e 4x4 cannot be built from 3-chip hosts; ", "valid chips_per_host: 4"),
    ),
    Row(
        "healthcheck-slices-0",
        ("-m", "jobs.healthcheck", "--slices", "0"),
        **_job_error(HEALTHCHECK, "argument --slices: 0 is not allowed; use 1 or more"),
    ),
    Row(
        "healthcheck-reserve-timeout-negative",
        ("-m", "jobs.healthcheck", "--reserve-timeout", "-1"),
        **_job_error(HEALTHCHECK, f"argument --reserve-timeout: -1 {NOT_POSITIVE}"),
    ),
    Row(
        "healthcheck-reserve-timeout-nan",
        ("-m", "jobs.healthcheck", "--reserve-timeout", "nan"),
        **_job_error(HEALTHCHECK, f"argument --reserve-timeout: nan {NOT_POSITIVE}"),
    ),
    Row(
        "healthcheck-timeout-inf",
        ("-m", "jobs.healthcheck", "--timeout", "inf"),
        **_job_error(HEALTHCHECK, f"argument --timeout: inf {NOT_POSITIVE}"),
    ),
    Row(
        "healthcheck-payload-mb-abc",
        ("-m", "jobs.healthcheck", "--payload-mb", "abc"),
        **_job_error(HEALTHCHECK, "argument --payload-mb: 'abc' is not a number; use a positive number"),
    ),
    Row(
        "healthcheck-max-preemptions-negative",
        ("-m", "jobs.healthcheck", "--max-preemptions", "-1"),
        **_job_error(HEALTHCHECK, "argument --max-preemptions: -1 is not allowed; use 0 or more"),
    ),
    Row(
        "healthcheck-max-failures-x",
        ("-m", "jobs.healthcheck", "--max-failures", "x"),
        **_job_error(HEALTHCHECK, "argument --max-failures: 'x' is not a whole number; use 0 or more"),
    ),
    Row(
        "healthcheck-step-timeout-0",
        ("-m", "jobs.healthcheck", "--step-timeout", "0"),
        **_job_error(HEALTHCHECK, f"argument --step-timeout: 0 {NOT_POSITIVE}"),
    ),
    # jobs.train: its own flags, the flags checked against the slice, and the fault flags
    Row("train-steps-0", ("-m", "jobs.train", "--steps", "0"), **_job_error(TRAIN, "argument --steps: 0 is not allowed; use 1 or more")),
    Row(
        "train-batch-size-not-a-multiple-of-the-chips",
        ("-m", "jobs.train", "--batch-size", "10"),
        **_job_error(TRAIN, "argument --batch-size: 10 must be a multiple of the 16 chips of 1 x v6e 4x4"),
    ),
    Row(
        "train-reserve-timeout-nan",
        ("-m", "jobs.train", "--reserve-timeout", "nan"),
        **_job_error(TRAIN, f"argument --reserve-timeout: nan {NOT_POSITIVE}"),
    ),
    Row(
        "train-max-preemptions-negative",
        ("-m", "jobs.train", "--max-preemptions", "-1"),
        **_job_error(TRAIN, "argument --max-preemptions: -1 is not allowed; use 0 or more"),
    ),
    Row(
        "train-max-failures-x",
        ("-m", "jobs.train", "--max-failures", "x"),
        **_job_error(TRAIN, "argument --max-failures: 'x' is not a whole number; use 0 or more"),
    ),
    Row(
        "train-max-failures-negative",
        ("-m", "jobs.train", "--max-failures", "-1"),
        **_job_error(TRAIN, "argument --max-failures: -1 is not allowed; use 0 or more"),
    ),
    Row(
        "train-step-timeout-0",
        ("-m", "jobs.train", "--step-timeout", "0"),
        **_job_error(TRAIN, f"argument --step-timeout: 0 {NOT_POSITIVE}"),
    ),
    # jobs.local up: never starts anything
    Row(
        "local-up-unknown-topology",
        ("-m", "jobs.local", "up", "--topology", "9x9"),
        **_job_error(LOCAL, "argument --topology: '9x9' is not offered for v6e; ", V6E_TOPOLOGIES),
    ),
    Row(
        "local-up-slices-0",
        ("-m", "jobs.local", "up", "--slices", "0"),
        **_job_error(LOCAL_UP, "argument --slices: 0 is not allowed; use 1 or more"),
    ),
    Row(
        "local-up-timeout-nan",
        ("-m", "jobs.local", "up", "--timeout", "nan"),
        **_job_error(LOCAL_UP, f"argument --timeout: nan {NOT_POSITIVE}"),
    ),
    Row(
        "local-up-host-cpus-0",
        ("-m", "jobs.local", "up", "--host-cpus", "0"),
        **_job_error(LOCAL_UP, "argument --host-cpus: 0 is not allowed; use 1 or more"),
    ),
    Row(
        "local-up-object-store-mb-abc",
        ("-m", "jobs.local", "up", "--object-store-mb", "abc"),
        **_job_error(LOCAL_UP, "argument --object-store-mb: 'abc' is not a whole number; use 1 or more"),
    ),
    Row(
        "local-up-state-dir-is-a-file",
        ("-m", "jobs.local", "up", "--state-dir", A_FILE),
        **_job_error(LOCAL, f"argument --state-dir: {A_FILE} is not a directory; pass another --state-dir"),
    ),
    Row(
        "local-up-state-dir-too-long",
        ("-m", "jobs.local", "up", "--state-dir", LONG_DIR),
        **_job_error(
            LOCAL,
            f"argument --state-dir: {LONG_DIR}/ray is too long for Ray's unix sockets (at most ",
            "characters); pass a shorter --state-dir",
        ),
    ),
    # jobs.submit: its own flags (the job's arguments after `--` are checked on the cluster)
    Row(
        "submit-timeout-negative",
        ("-m", "jobs.submit", "healthcheck", "--timeout", "-1"),
        **_job_error(SUBMIT, f"argument --timeout: -1 {NOT_POSITIVE}"),
    ),
    Row(
        "submit-timeout-nan",
        ("-m", "jobs.submit", "healthcheck", "--timeout", "nan"),
        **_job_error(SUBMIT, f"argument --timeout: nan {NOT_POSITIVE}"),
    ),
    Row(
        "submit-timeout-abc",
        ("-m", "jobs.submit", "healthcheck", "--timeout", "abc"),
        **_job_error(SUBMIT, "argument --timeout: 'abc' is not a number; use a positive number of seconds"),
    ),
    Row(
        "submit-request-timeout-nan",
        ("-m", "jobs.submit", "healthcheck", "--request-timeout", "nan"),
        **_job_error(SUBMIT, f"argument --request-timeout: nan {NOT_POSITIVE}"),
    ),
    Row(
        "submit-env-var-without-value",
        ("-m", "jobs.submit", "healthcheck", "--env-var", "FOO"),
        **_job_error(SUBMIT, "--env-var takes KEY=VALUE, got 'FOO'"),
    ),
    Row(
        "submit-unknown-job",
        ("-m", "jobs.submit", "bogus"),
        kind="line",
        first="error: job 'bogus' is not a workload; valid: healthcheck, train",
        expect=(),
    ),
    Row("submit-no-job", ("-m", "jobs.submit"), kind="line", first="error: no job given; valid: healthcheck, train", expect=()),
    Row(
        "submit-bad-job-argument",
        ("-m", "jobs.submit", "healthcheck", "--", "--slices", "0"),
        kind="line",
        first="python -m jobs.healthcheck: error: argument --slices: 0 is not allowed; use 1 or more",
        expect=(),
    ),
    # jobs.demo: never starts anything
    Row(
        "demo-unknown-topology",
        ("-m", "jobs.demo", "--topology", "9x9"),
        **_job_error(DEMO, "argument --topology: '9x9' is not offered for v6e; ", V6E_TOPOLOGIES),
    ),
    Row("demo-slices-0", ("-m", "jobs.demo", "--slices", "0"), **_job_error(DEMO, "argument --slices: 0 is not allowed; use 1 or more")),
    Row(
        "demo-train-steps-0",
        ("-m", "jobs.demo", "--train-steps", "0"),
        **_job_error(DEMO, "argument --train-steps: 0 is not allowed; use 1 or more"),
    ),
    Row(
        "demo-job-timeout-negative",
        ("-m", "jobs.demo", "--job-timeout", "-1"),
        **_job_error(DEMO, f"argument --job-timeout: -1 {NOT_POSITIVE}"),
    ),
    Row(
        "demo-reserve-timeout-nan",
        ("-m", "jobs.demo", "--reserve-timeout", "nan"),
        **_job_error(DEMO, f"argument --reserve-timeout: nan {NOT_POSITIVE}"),
    ),
    Row(
        "demo-state-dir-is-a-file",
        ("-m", "jobs.demo", "--state-dir", A_FILE),
        **_job_error(DEMO, f"argument --state-dir: {A_FILE} is not a directory; pass another --state-dir"),
    ),
    # python -m infra.doctor and python -m infra: plain argparse (usage block, then the error line)
    Row(
        "infra-doctor-timeout-negative",
        ("-m", "infra.doctor", "--timeout", "-1", "--endpoint", GUARD_ENDPOINT),
        kind="usage",
        first=f"{DOCTOR}: error: argument --timeout: -1 {NOT_POSITIVE}",
        expect=(),
    ),
    Row(
        "infra-doctor-timeout-nan",
        ("-m", "infra.doctor", "--timeout", "nan", "--endpoint", GUARD_ENDPOINT),
        kind="usage",
        first=f"{DOCTOR}: error: argument --timeout: nan {NOT_POSITIVE}",
        expect=(),
    ),
    Row(
        "infra-unknown-command",
        ("-m", "infra", "bogus"),
        kind="usage",
        first=f"{INFRA}: error: argument command: invalid choice: 'bogus' (choose from ",
        expect=("manifests", "show", "envs"),
    ),
]

ROWS = _config_rows() + ARG_ROWS
assert len({r.id for r in ROWS}) == len(ROWS), "row ids must be unique"


# --- running the sweep ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    left_behind: dict[str, list[str]]  # checked directory -> what is in it afterwards
    values: dict[str, str]  # placeholder -> what it stood for in this row


def _git_status() -> list[str]:
    # --no-optional-locks: a status must not refresh (write) the index of a tree others work in.
    out = subprocess.run(
        ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=all"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return sorted(line for line in out.splitlines() if "__pycache__" not in line)


def _tree() -> set[str]:
    """Every path in the repo, gitignored ones included (build/, cdktf.out/), but for the unlisted."""
    found = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in UNLISTED and not d.startswith(".venv")]
        found.update(os.path.relpath(os.path.join(root, name), REPO) for name in dirs + files)
    return found


def _fill(text: str, values: dict[str, str]) -> str:
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


def _run(row: Row, work: Path, configs: Path, a_file: Path, empty_bin: Path) -> Outcome:
    values = {A_FILE: str(a_file), LONG_DIR: str(Path("/tmp") / ("d" * 80))}
    if row.config is not None:
        bad = row.config
        if bad.env_name is not None:
            values |= {CONFIG: bad.env_name, SOURCE: f"environment {bad.env_name!r}"}
        else:
            path = configs / f"{bad.name}.yaml"
            values |= {CONFIG: str(path), SOURCE: str(path)}
    dirs = {name: work / row.id / name for name in ("cwd", "home", "ray_tmp", "tmp")}
    for d in dirs.values():
        d.mkdir(parents=True)
    env = {
        "PATH": str(empty_bin),  # no gcloud, no kubectl
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
        "HOME": str(dirs["home"]),
        "RAY_TMPDIR": str(dirs["ray_tmp"]),
        "TMPDIR": str(dirs["tmp"]),
        "RAY_ADDRESS": GUARD_RAY_ADDRESS,
        **{k: _fill(v, values) for k, v in row.env.items()},
    }
    argv = [sys.executable, *(_fill(a, values) for a in row.argv)]
    try:
        proc = subprocess.run(argv, cwd=dirs["cwd"], env=env, capture_output=True, text=True, errors="replace", timeout=ROW_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        return Outcome(-1, str(err.stdout or ""), f"timed out after {ROW_TIMEOUT_S} s: {argv}", {}, values)
    left = {name: sorted(os.listdir(d)) for name, d in dirs.items()}
    return Outcome(proc.returncode, proc.stdout, proc.stderr, {k: v for k, v in left.items() if v}, values)


@dataclass(frozen=True)
class Sweep:
    outcomes: dict[str, Outcome]
    git_before: list[str]
    git_after: list[str]
    new_paths: set[str]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Sweep:
    configs = tmp_path_factory.mktemp("bad-configs")
    for bad in BAD_CONFIGS:
        if isinstance(bad.content, bytes):
            (configs / f"{bad.name}.yaml").write_bytes(bad.content)
        elif bad.content is not None:
            (configs / f"{bad.name}.yaml").write_text(bad.content)
    a_file = configs / "a-file"
    a_file.write_text("not a directory\n")
    empty_bin = tmp_path_factory.mktemp("empty-bin")
    work = tmp_path_factory.mktemp("rows")
    git_before, tree_before = _git_status(), _tree()
    workers = min(8, (os.cpu_count() or 2) + 2)
    with ThreadPoolExecutor(workers) as pool:
        outcomes = dict(zip((r.id for r in ROWS), pool.map(lambda r: _run(r, work, configs, a_file, empty_bin), ROWS), strict=False))
    return Sweep(outcomes, git_before, _git_status(), _tree() - tree_before)


def _message_line(row: Row, text: str, values: dict[str, str]) -> str:
    """Check the message's shape; return the line that must name the field."""
    first, end = _fill(row.first, values), _fill(row.end, values)
    assert text.endswith("\n"), text
    lines = text[:-1].split("\n")
    if row.kind == "line":
        assert len(lines) == 1, text
        line = lines[0]
        assert line.startswith(first), text
    elif row.kind == "report":
        assert len(lines) == 2, text  # the header and one bullet: one bad field, one line
        assert lines[0] == first, text
        line = lines[1]
        assert line.startswith("  - "), text
    else:  # argparse's usage block, then one error line
        prog = first.split(": error: ")[0]
        assert lines[0].startswith(f"usage: {prog} "), text
        assert all(line.startswith(" ") for line in lines[1:-1]), text  # usage continuation lines
        line = lines[-1]
        assert line.startswith(first), text
    assert line.endswith(end), text
    return line


@pytest.mark.parametrize(
    "row", [pytest.param(r, id=r.id, marks=[pytest.mark.xfail(strict=True, reason=r.xfail)] if r.xfail else []) for r in ROWS]
)
def test_bad_input_exits_nonzero_naming_the_field_without_traceback_writing_nothing(row: Row, sweep: Sweep):
    out = sweep.outcomes[row.id]
    shown = f"exit {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    assert out.returncode not in (0, -1), shown
    assert "Traceback" not in out.stdout and "Traceback" not in out.stderr, shown
    assert out.stdout == "", shown  # the message goes to stderr; nothing half-printed on stdout
    line = _message_line(row, out.stderr, out.values)
    for expected in row.expect:
        assert _fill(expected, out.values) in line, shown
    assert out.left_behind == {}, f"{row.id} wrote {out.left_behind}"


def test_the_sweep_wrote_nothing_into_the_repo(sweep: Sweep):
    assert sweep.git_after == sweep.git_before
    assert sweep.new_paths == set(), f"new files in the repo: {sorted(sweep.new_paths)}"
