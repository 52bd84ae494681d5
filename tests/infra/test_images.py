"""infra.images: which Ray images exist (Ray's release, as read), our images' names and their build
script; and what the config and the printed manifests do with them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from infra import images
from infra.config import ConfigError, load_environment, parse_environment
from jobs import REPO_ROOT as REPO

DIGEST = "sha256:" + "ab" * 32
OUR_TPU = f"us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@{DIGEST}"
OUR_SERVE = f"us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-serve-tpu@{DIGEST}"


@pytest.mark.parametrize(
    "image",
    ["rayproject/ray:2.60.0-py312-tpu", "rayproject/ray:2.60.0-py312", "docker.io/rayproject/ray:2.60.0-py311-tpu", OUR_TPU, "ray:2"],
)
def test_published_ray_tags_and_other_images_pass(image):
    assert images.published(image) is None


def test_a_python_the_release_does_not_publish_is_refused_with_the_tags_it_does():
    problem = images.published("rayproject/ray:2.60.0-py39-tpu")
    assert problem and "publishes no 2.60.0-py39-tpu image" in problem and "2.60.0-py312-tpu" in problem
    assert "ray-project/ray" in problem  # the source
    # The unsuffixed tag is Ray's default Python (3.10), which TPU7x's jax[tpu] cannot run.
    assert "names no Python" in images.published("rayproject/ray:2.60.0-tpu")
    assert images.published("rayproject/ray:2.99.0-py39-tpu") is None  # a release not read here: not checked


def test_the_config_refuses_an_unpublished_image_naming_the_field():
    data = yaml.safe_load((REPO / "infra/environments/dev.yaml").read_text())
    data["ray"]["tpu_images"] = {"v6e": "rayproject/ray:2.60.0-py314-tpu"}
    with pytest.raises(ConfigError) as err:
        parse_environment({**data, "name": "dev"})
    assert any(p.startswith("ray.tpu_images.v6e: Ray 2.60.0 publishes no 2.60.0-py314-tpu image") for p in err.value.problems)


def test_our_tpu_image_is_recognised_wherever_it_was_pushed():
    assert images.is_project_tpu_image(OUR_TPU)
    assert images.is_project_tpu_image("europe-docker.pkg.dev/p/ray-tpu-gke/ray-tpu:123")
    assert not images.is_project_tpu_image(OUR_SERVE)
    assert not images.is_project_tpu_image("rayproject/ray:2.60.0-py312-tpu")
    assert not images.is_project_tpu_image("us-docker.pkg.dev/p/other/ray-tpu:1")


def test_registry_follows_the_regions_continent():
    assert images.registry("p", "us-east5") == "us-docker.pkg.dev/p/ray-tpu-gke"
    assert images.registry_location("europe-west4") == "europe" and images.registry_location("asia-northeast1") == "asia"
    assert images.registry_location("me-central2") == "me-central2"


def test_the_build_script_builds_from_the_bases_digest_and_records_the_pushed_digest():
    builds = images.project_builds(
        "us-docker.pkg.dev/p/ray-tpu-gke", "rayproject/ray:2.60.0-py312-tpu", "rayproject/ray:2.60.0-py312", "b7"
    )
    script = images.build_script(builds).splitlines()
    assert script[0] == "set -euo pipefail"
    tpu = [line for line in script if "ray-tpu:b7" in line or "py312-tpu" in line]
    steps = [line.split()[1] if line.startswith("docker") else line.split("=")[0] for line in tpu if not line.startswith("#")]
    assert steps == ["pull", "base_ref", "build", "push", "inspect"]
    build = next(line for line in tpu if line.startswith("docker build"))
    assert '--build-arg BASE_IMAGE="$base_ref"' in build and "--file images/tpu.Dockerfile" in build
    assert "> build/images/tpu.ref" in script[script.index(next(line for line in tpu if line.startswith("docker push"))) + 1]


def test_python_m_infra_images_prints_the_script_for_the_environment():
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "images", "--env", "prod", "--tag", "42"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "--tag us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu:42" in proc.stdout
    assert "--tag us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-serve-tpu:42" in proc.stdout
    assert "docker pull rayproject/ray:2.60.0-py312-tpu" in proc.stdout and "docker pull rayproject/ray:2.60.0-py312\n" in proc.stdout


def manifests(*args: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "manifests", "--env", "dev", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


def containers(docs: list[dict], kind: str) -> list[dict]:
    doc = next(d for d in docs if d["kind"] == kind)
    spec = doc["spec"] if kind == "RayCluster" else doc["spec"]["rayClusterConfig"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_the_manifests_run_the_images_the_build_produced():
    docs = manifests("--tpu-image", OUR_TPU, "--serve-image", OUR_SERVE)
    cluster = containers(docs, "RayCluster")
    assert cluster[0]["image"] == "rayproject/ray:2.60.0-py312"  # the head: CPU only
    assert [c["image"] for c in cluster[1:]] == [OUR_TPU] * (len(cluster) - 1)
    assert {c["image"] for c in containers(docs, "RayService")} == {OUR_SERVE}
    service = next(d for d in docs if d["kind"] == "RayService")
    # The serving image carries vLLM: the application installs nothing at replica start.
    assert "pip" not in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0].get("runtime_env", {})
    # Without them, the config's own (Ray's images; the application installs vllm-tpu).
    plain = manifests()
    assert {c["image"] for c in containers(plain, "RayCluster")[1:]} == {"rayproject/ray:2.60.0-py312-tpu"}
    plain_service = next(d for d in plain if d["kind"] == "RayService")
    assert yaml.safe_load(plain_service["spec"]["serveConfigV2"])["applications"][0]["runtime_env"]["pip"] == ["vllm-tpu==0.29.0"]


def test_a_bad_image_reference_is_one_line_naming_the_field():
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "manifests", "--env", "dev", "--tpu-image", "rayproject/ray:2.60.0-py39-tpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert "ray.tpu_images.v6e: Ray 2.60.0 publishes no 2.60.0-py39-tpu image" in proc.stderr
    assert load_environment("dev", tpu_image=OUR_TPU).ray.worker_image("v6e") == OUR_TPU
