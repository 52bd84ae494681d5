"""The RayService: valid against the KubeRay CRDs strictly, its cluster the catalog's slice, its
serve config importing jobs.serve, and the GCS FUSE / shared-memory / secret plumbing in place."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.config import ENVIRONMENTS_DIR, ConfigError, environment_names, load_environment, parse_environment
from infra.manifests.raycluster import RayClusterPods, ray_cluster, tpu_worker_group
from infra.manifests.rayservice import CODE_DIR, ray_service, serve_config, serve_service_name
from infra.serving import SERVE_FAST_PATH_ENV
from jobs.serve.local import CPU_SIMULATION_ENV
from tests.kuberay_schema import errors

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
SERVE_IMAGE = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-serve-tpu@sha256:" + "a" * 64


@pytest.fixture(scope="module")
def crds() -> Path:
    path = SHARED / "kuberay" / "crds"
    if not (path / "ray.io_rayservices.yaml").is_file():
        pytest.skip("../shared/kuberay/crds is not here")
    return path


def dev_data(**serving) -> dict:
    data = yaml.safe_load((ENVIRONMENTS_DIR / "dev.yaml").read_text()) | {"name": "dev"}
    data["serving"] = {**data["serving"], **serving}
    return data


def pods(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]


def test_dev_rayservice_validates_strictly_against_the_crd(crds):
    assert errors(crds, ray_service(load_environment("dev"))) == []


def test_with_hf_token_secret_and_hf_model_it_still_validates(crds):
    env = parse_environment(dev_data(model="meta-llama/Llama-3.1-8B-Instruct", hf_token_secret="hf-token"))
    assert errors(crds, ray_service(env)) == []


def test_strict_validation_catches_a_misplaced_field(crds):
    manifest = ray_service(load_environment("dev"))
    bad = copy.deepcopy(manifest)
    bad["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert any("volumeMount" in e for e in errors(crds, bad))


@pytest.mark.parametrize("env_name", environment_names())
def test_every_shipped_serving_config_validates(crds, env_name):
    env = load_environment(env_name)
    if env.serving is None:
        pytest.skip(f"{env_name} has no serving section")
    assert errors(crds, ray_service(env)) == []


def test_serve_config_imports_our_builder_with_the_env_name():
    env = load_environment("dev")
    manifest = ray_service(env)
    parsed = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    assert parsed == serve_config(env)
    (app,) = parsed["applications"]
    assert app["import_path"] == "jobs.serve:build_app"
    assert app["args"] == {"env": "dev"}
    assert app["runtime_env"]["pip"] == ["vllm-tpu==0.29.0"]
    assert parsed["http_options"]["port"] == 8000
    assert serve_service_name(env) == "ray-tpu-dev-serve-serve-svc"


def test_the_worker_group_is_the_groups_own_sized_to_the_replicas():
    env = load_environment("dev")
    (served,) = ray_service(env)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    plain = tpu_worker_group(env, env.slice_group("v6e-2x2"), RayClusterPods("other", token_secret=None), slices=1)
    assert served["groupName"] == "v6e-2x2-serve"  # never a RayCluster group's name
    assert served["numOfHosts"] == plain["numOfHosts"] == 1
    assert (served["replicas"], served["minReplicas"], served["maxReplicas"]) == (1, 1, 1)
    assert served["template"]["spec"]["nodeSelector"] == plain["template"]["spec"]["nodeSelector"]
    assert served["template"]["spec"]["nodeSelector"]["ray-tpu-gke/slice-group"] == "v6e-2x2"
    (container,) = served["template"]["spec"]["containers"]
    (plain_container,) = plain["template"]["spec"]["containers"]
    assert container["resources"] == plain_container["resources"]
    assert container["image"] == "rayproject/ray:2.60.0-py312"  # vllm-tpu is cp312-only


def test_a_shared_group_is_split_between_the_raycluster_and_the_rayservice():
    data = dev_data(slice_group="v6e-4x4")
    data["slice_groups"][0]["slices"] = 3
    env = parse_environment(data)
    cluster_group = next(g for g in ray_cluster(env)["spec"]["workerGroupSpecs"] if g["groupName"] == "v6e-4x4")
    (served,) = ray_service(env)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (cluster_group["replicas"], cluster_group["maxReplicas"]) == (2, 2)
    assert (served["groupName"], served["replicas"]) == ("v6e-4x4-serve", 1)


def test_every_pod_mounts_the_bucket_with_gcs_fuse_and_has_shm():
    env = load_environment("dev")
    for template in pods(ray_service(env)):
        assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
        spec = template["spec"]
        assert spec["serviceAccountName"] == env.ray.kubernetes_service_account  # Workload Identity
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["bucket"]["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
        assert volumes["bucket"]["csi"]["volumeAttributes"]["bucketName"] == env.bucket_name
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
        assert "gke-gcsfuse-cache" in volumes
        (container,) = spec["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts == {"/gcs": "bucket", "/dev/shm": "dshm"}
        env_vars = {e["name"]: e.get("value") for e in container["env"]}
        assert env_vars["PYTHONPATH"] == CODE_DIR
        assert env_vars["VLLM_XLA_CACHE_PATH"] == "/gcs/xla-cache"
        assert "HF_TOKEN" not in env_vars


def test_hf_token_comes_only_from_the_named_secret():
    env = parse_environment(dev_data(hf_token_secret="hf-token"))
    manifest = ray_service(env)
    for template in pods(manifest):
        (container,) = template["spec"]["containers"]
        (token,) = [e for e in container["env"] if e["name"] == "HF_TOKEN"]
        assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}}
    assert "hf-token" not in manifest["spec"]["serveConfigV2"]


def test_no_second_cluster_on_upgrade():
    # The RayService holds exactly its replicas' slices: a NewCluster upgrade would wait forever.
    assert ray_service(load_environment("dev"))["spec"]["upgradeStrategy"] == {"type": "None"}


def test_unservable_config_is_a_config_error_naming_serving():
    data = dev_data(replicas=3)
    with pytest.raises(ConfigError, match=r"serving.replicas: serving.replicas \(3\) is more than slice group v6e-2x2 has slices \(1\)"):
        parse_environment(data)
    data = dev_data()
    data.pop("serving")
    with pytest.raises(ConfigError, match="no serving section"):
        ray_service(parse_environment(data))


def test_every_pod_runs_ray_serves_high_throughput_path_and_nothing_of_the_cpu_simulation():
    # The Serve controller and HAProxy read these at start: pod env, on the head and the workers.
    for template in pods(ray_service(load_environment("dev"))):
        (container,) = template["spec"]["containers"]
        env_vars = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env_vars.get(k) for k in SERVE_FAST_PATH_ENV} == SERVE_FAST_PATH_ENV
        assert env_vars["RAY_SERVE_DEFAULT_HTTP_HOST"] == "0.0.0.0"  # HAProxy reaches replicas on other nodes
        assert not set(CPU_SIMULATION_ENV) & set(env_vars)


def print_manifests(env: Path | str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "infra", "manifests", "--env", str(env), *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_only_an_opted_in_environment_pip_installs_vllm_at_replica_start(tmp_path):
    # A serving section like dev's, without dev's opt-in: no RayService without the serving image.
    data = dev_data() | {"name": "staging"}
    data["serving"].pop("pip_install_vllm")
    path = tmp_path / "staging.yaml"
    path.write_text(yaml.safe_dump(data))
    refused = print_manifests(path)
    assert refused.returncode == 2 and refused.stdout == "" and "Traceback" not in refused.stderr
    assert "serving.image is not set, so every replica start would pip-install vllm-tpu==0.29.0" in refused.stderr
    assert "serving.pip_install_vllm: true" in refused.stderr
    # With the image Cloud Build's images stage pushed (SERVE_IMAGE -> --serve-image): no pip at all.
    served = print_manifests(path, "--serve-image", SERVE_IMAGE)
    assert served.returncode == 0, served.stderr
    (service,) = [d for d in yaml.safe_load_all(served.stdout) if d["kind"] == "RayService"]
    assert {c["image"] for t in pods(service) for c in t["spec"]["containers"]} == {SERVE_IMAGE}
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    assert "pip" not in app["runtime_env"]
    # dev opts in: its embedded default still installs vllm-tpu on Ray's image.
    (dev_service,) = [d for d in yaml.safe_load_all(print_manifests("dev").stdout) if d["kind"] == "RayService"]
    (dev_app,) = yaml.safe_load(dev_service["spec"]["serveConfigV2"])["applications"]
    assert dev_app["runtime_env"]["pip"] == ["vllm-tpu==0.29.0"]
