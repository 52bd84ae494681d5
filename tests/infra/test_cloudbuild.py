"""cloudbuild.yaml: it parses, every stage is a Make target that exists, every substitution it
uses is declared, and the stages that need no cloud run here as written (the synth stage is the
session's one synth, tests/infra/conftest.py; the test stage is this very suite, so only `make -n`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra import images
from infra.config import environment_names, load_environment

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
    # The images are built and pushed before the manifests that name them.
    assert ids == ["builder", "test", "synth", "plan", "deploy", "images", "manifests", "smoke"]


@pytest.mark.parametrize("step_id", ["test", "synth", "plan", "deploy", "images", "manifests", "smoke"])
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
    for step_id in ("deploy", "images", "manifests", "smoke"):
        script = " ".join(step(step_id)["args"])
        assert '"$$BRANCH" = main' in script and '"$$DEPLOY" = true' in script


def test_tool_versions_pinned_in_one_place():
    dockerfile = (REPO / "ci" / "builder.Dockerfile").read_text()
    assert re.search(r"ARG TERRAFORM_VERSION=\d+\.\d+\.\d+", dockerfile)
    assert re.search(r"ARG NODE_MAJOR=\d+", dockerfile)
    package = yaml.safe_load((REPO / "package.json").read_text())
    assert package["dependencies"]["cdktf-cli"] == "0.21.0"


def test_the_manifests_and_smoke_stages_use_the_images_this_build_pushed():
    # The images stage writes each pushed name@sha256 where infra.images says; the later stages pass
    # them on as TPU_IMAGE / SERVE_IMAGE (the Makefile turns them into --tpu-image / --serve-image).
    images_stage = " ".join(step("images")["args"])
    assert "make images" in images_stage and "IMAGE_TAG=${BUILD_ID}" in images_stage and "REGISTRY=${_REGISTRY}" in images_stage
    tpu_ref, serve_ref = (f"{images.BUILD_DIR}/{kind}.ref" for kind in ("tpu", "serve"))
    manifests_stage = " ".join(step("manifests")["args"])
    assert f'TPU_IMAGE="$$(cat {tpu_ref})"' in manifests_stage and f'SERVE_IMAGE="$$(cat {serve_ref})"' in manifests_stage
    assert f'TPU_IMAGE="$$(cat {tpu_ref})"' in " ".join(step("smoke")["args"])
    for target, flag in (("apply-manifests", "--tpu-image ref@sha256:t"), ("smoke", "--tpu-image ref@sha256:t")):
        proc = subprocess.run(
            ["make", "-n", target, "TPU_IMAGE=ref@sha256:t", "SERVE_IMAGE=ref@sha256:s"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0 and flag in proc.stdout, proc.stdout + proc.stderr
    assert (
        "--serve-image ref@sha256:s"
        in subprocess.run(
            ["make", "-n", "apply-manifests", "SERVE_IMAGE=ref@sha256:s"], cwd=REPO, capture_output=True, text=True, timeout=60
        ).stdout
    )


def test_the_builder_and_the_images_share_the_bootstrapped_repository():
    # One Artifact Registry repository (`python -m infra bootstrap` creates it, in the multi-region
    # of the environment's region) holds the builder and both images.
    registry = BUILD["substitutions"]["_REGISTRY"]
    assert BUILD["substitutions"]["_BUILDER_IMAGE"] == f"{registry}/builder:latest"
    assert registry.endswith(f"/{images.ARTIFACT_REPOSITORY}")
    for name in environment_names():
        env = load_environment(name)
        assert images.registry(env.project, env.region) == registry.replace("${PROJECT_ID}", env.project), name
        proc = subprocess.run(
            [sys.executable, "-m", "infra", "bootstrap", "--env", name], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0 and images.repository_command(env.project, env.region) in proc.stdout


def test_the_rayjob_build_runs_make_rayjob_with_every_substitution_declared():
    path = REPO / "ci" / "rayjob.cloudbuild.yaml"
    build = yaml.safe_load(path.read_text())
    text = path.read_text()
    used = set(re.findall(r"\$\{(_[A-Z_]+)\}", text))
    assert used <= set(build["substitutions"]) and {"_ENV", "_JOB", "_ARGS", "_TPU_IMAGE"} <= used
    (stage,) = build["steps"]
    assert make_targets(stage) == ["rayjob"]
    proc = subprocess.run(
        ["make", "-n", "rayjob", "JOB=train", "TPU_IMAGE=ref@sha256:t", "PRIORITY=high", "ARGS=--steps 5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "-m jobs.submit train --env dev --tpu-image ref@sha256:t --priority high --rayjob" in proc.stdout, (
        proc.stdout + proc.stderr
    )
