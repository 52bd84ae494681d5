"""The test session's one cdktf synth: `make synth` (the real cdktf CLI), every shipped environment
plus the sweep's (tests/infra/sweep.py: every shape x capacity x fixed/autoscaled) and the team
configs beside them, in one app.

Importing the provider bindings costs ~20 s and ~0.5 GB, so it happens once, in the CLI's child
process; the tests read the synthesized `cdk.tf.json` files and use cdktf's own matchers on them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.config import Environment, environment_names, load_environment
from tests.infra.sweep import write_sweep, write_team

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


def cdktf_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TF_CLI_CONFIG_FILE", None)
    env.update(
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
        CDKTF_DISABLE_PLUGIN_CACHE_ENV="true",
        CHECKPOINT_DISABLE="1",
        CI="1",
    )
    return env


def run_cdktf_synth(outdir: Path, extra_env: dict[str, str] | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`make synth`, exactly as the Cloud Build synth stage runs it, into `outdir`."""
    if shutil.which("npx") is None or not (REPO / "node_modules" / ".bin" / "cdktf").exists():
        pytest.fail("the cdktf CLI is not installed: run `make setup` (npm ci)")
    return subprocess.run(
        ["make", "--no-print-directory", "synth", f"CDKTF_OUT={outdir}"],
        cwd=REPO,
        env={**cdktf_env(), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@dataclass(frozen=True)
class Synthesized:
    env: Environment
    text: str  # cdk.tf.json as written, for cdktf's Testing matchers
    path: Path

    @property
    def json(self) -> dict:
        return json.loads(self.text)

    def resources(self, tf_type: str) -> dict[str, dict]:
        return self.json.get("resource", {}).get(tf_type, {})

    def one(self, tf_type: str) -> dict:
        found = list(self.resources(tf_type).values())
        assert len(found) == 1, f"expected one {tf_type}, found {len(found)}"
        return found[0]


@pytest.fixture(scope="session")
def sweep_paths(tmp_path_factory) -> list[Path]:
    return write_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="session")
def team_paths(tmp_path_factory) -> list[Path]:
    return write_team(tmp_path_factory.mktemp("team"))


@pytest.fixture(scope="session")
def synth_outdir(tmp_path_factory, sweep_paths, team_paths) -> Path:
    outdir = tmp_path_factory.mktemp("cdktf-out")
    envs = ",".join([*environment_names(), *map(str, sweep_paths), *map(str, team_paths)])
    proc = run_cdktf_synth(outdir, {"RAY_TPU_ENVS": envs})
    assert proc.returncode == 0, f"cdktf synth failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return outdir


def synthesized(outdir: Path, envs: list[str] | list[Path]) -> dict[str, Synthesized]:
    """{environment name: its synthesized stack} for environments by name or path."""
    out = {}
    for name in envs:
        env = load_environment(name)
        path = outdir / "stacks" / env.stack_name / "cdk.tf.json"
        out[env.name] = Synthesized(env, path.read_text(), path)
    return out


@pytest.fixture(scope="session")
def sweep_stacks(synth_outdir, sweep_paths) -> dict[str, Synthesized]:
    return synthesized(synth_outdir, sweep_paths)


@pytest.fixture(scope="session")
def team_stacks(synth_outdir, team_paths) -> dict[str, Synthesized]:
    return synthesized(synth_outdir, team_paths)


@pytest.fixture(scope="session")
def stacks(synth_outdir) -> dict[str, Synthesized]:
    return synthesized(synth_outdir, environment_names())


def shared_dir(*parts: str) -> Path:
    """A folder of ../shared, or a clean skip where it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.is_dir():
        pytest.skip(f"../shared/{'/'.join(parts)} is not here")
    return path


@pytest.fixture(scope="session")
def kueue_crds() -> Path:
    return shared_dir("kueue", "crds")


@pytest.fixture(scope="session")
def crds() -> Path:
    return shared_dir("kuberay", "crds")
