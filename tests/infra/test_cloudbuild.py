"""cloudbuild.yaml: it parses, every stage is a Make target that exists, every substitution it
uses is declared, and the stages that need no cloud run here as written (the synth stage is the
session's one synth, tests/infra/conftest.py; the test stage is this very suite, so only `make -n`)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
BUILTINS = {"PROJECT_ID", "BUILD_ID", "BRANCH_NAME", "COMMIT_SHA", "SHORT_SHA", "REPO_NAME", "TAG_NAME", "LOCATION"}


def step(step_id: str) -> dict:
    return next(s for s in BUILD["steps"] if s["id"] == step_id)


def make_targets(s: dict) -> list[str]:
    if s.get("entrypoint") == "make":
        return [a for a in s["args"] if not a.startswith("-") and "=" not in a]
    return re.findall(r"\bmake ([a-z][-a-z]*)", " ".join(s.get("args", [])))


def test_stages_in_order():
    ids = [s["id"] for s in BUILD["steps"]]
    assert ids == ["builder", "test", "synth", "plan", "deploy", "manifests", "smoke"]


@pytest.mark.parametrize("step_id", ["test", "synth", "plan", "deploy", "manifests", "smoke"])
def test_every_stage_is_an_existing_make_target(step_id):
    targets = make_targets(step(step_id))
    assert targets, f"stage {step_id} runs no make target"
    for target in targets:
        proc = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"make -n {target}: {proc.stderr}"


@pytest.mark.synth
def test_synth_stage_ran_here_as_written(synth_outdir):
    # The session's one synth (conftest.run_cdktf_synth) is `make synth`, the synth stage's command.
    assert make_targets(step("synth")) == ["synth"]
    stacks = {p.name for p in (synth_outdir / "stacks").iterdir()}
    assert {"ray-tpu-autopilot", "ray-tpu-dev", "ray-tpu-prod"} <= stacks  # and the sweep's


def test_test_stage_is_this_suite():
    assert make_targets(step("test")) == ["test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_substitutions_used_are_declared():
    text = (REPO / "cloudbuild.yaml").read_text()
    used = set(re.findall(r"\$\{(_[A-Z_]+)\}", text))
    declared = set(BUILD["substitutions"])
    assert used <= declared, f"undeclared: {used - declared}"
    assert {"_ENV", "_DEPLOY"} <= declared
    others = set(re.findall(r"\$\{([A-Z][A-Z_]+)\}", text)) - used
    assert others <= BUILTINS, f"unknown built-in substitutions: {others - BUILTINS}"


def test_deploy_only_on_main_or_when_asked():
    for step_id in ("deploy", "manifests", "smoke"):
        script = " ".join(step(step_id)["args"])
        assert '"$$BRANCH" = main' in script and '"$$DEPLOY" = true' in script


def test_tool_versions_pinned_in_one_place():
    dockerfile = (REPO / "ci" / "builder.Dockerfile").read_text()
    assert re.search(r"ARG TERRAFORM_VERSION=\d+\.\d+\.\d+", dockerfile)
    assert re.search(r"ARG NODE_MAJOR=\d+", dockerfile)
    package = yaml.safe_load((REPO / "package.json").read_text())
    assert package["dependencies"]["cdktf-cli"] == "0.21.0"
