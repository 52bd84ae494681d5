"""The LLMConfig that jobs.serve derives from an environment's serving section, per TPU shape.

Pure tests run in the main venv (no vLLM). Where Ray Serve LLM is importable (the .venv-serve
environment, or a TPU image), the same kwargs also go through `ray.serve.llm.LLMConfig` and Ray's
own placement logic; elsewhere those tests skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.config import ENVIRONMENTS_DIR, ConfigError, Environment, environment_names, load_environment, parse_environment
from infra.serving import ServeConfigError, cpu_llm_config_kwargs, llm_config_kwargs, mounted_path, served_model_id
from jobs.serve import build_app

REPO = Path(__file__).resolve().parents[3]


def env_with(group: dict, **serving) -> Environment:
    """dev, with one slice group and serving on it."""
    data = yaml.safe_load((ENVIRONMENTS_DIR / "dev.yaml").read_text())
    data["name"] = "dev"
    data["slice_groups"] = [{"name": "serve", "slices": 1, **group}]
    data["serving"] = {**data["serving"], "slice_group": "serve", **serving}
    # A zone that offers the generation (Cloud TPU "TPU regions and zones"), and the GKE version it needs.
    zone = {"tpu7x": "us-central1-c", "v5p": "us-east5-a"}.get(group.get("generation", ""))
    if zone:
        data.update(region=zone[:-2], zone=zone, gke_min_version="1.35")
        data["bucket"] = {"location": zone[:-2]}
        data["serving"]["model"] = "meta-llama/Llama-3.1-8B-Instruct"
    return parse_environment(data)


# (slice group, tensor parallel size, accelerator_config or None, hosts)
SHAPES = {
    "v6e-2x2": ({"generation": "v6e", "topology": "2x2"}, "TPU-V6E", 4, None),
    "v6e-2x4-one-host": ({"generation": "v6e", "topology": "2x4", "chips_per_host": 8}, "TPU-V6E", 8, None),
    "v6e-4x4": ({"generation": "v6e", "topology": "4x4"}, "TPU-V6E", 16, {"kind": "tpu", "topology": "4x4"}),
    "tpu7x-2x2x2": ({"generation": "tpu7x", "topology": "2x2x2"}, "TPU-V7X", 8, {"kind": "tpu", "topology": "2x2x2"}),
    "v5p-2x2x1": ({"generation": "v5p", "topology": "2x2x1"}, "TPU-V5P", 4, None),
    "v6e-8x8": ({"generation": "v6e", "topology": "8x8"}, "TPU-V6E", 64, {"kind": "tpu", "topology": "8x8"}),
}


@pytest.mark.parametrize("name", SHAPES)
def test_tpu_shape_gives_accelerator_type_tensor_parallel_and_topology(name):
    group, accelerator_type, tp, accelerator_config = SHAPES[name]
    kw = llm_config_kwargs(env_with(group))
    assert kw["accelerator_type"] == accelerator_type
    assert kw["engine_kwargs"]["tensor_parallel_size"] == tp
    assert kw.get("accelerator_config") == accelerator_config
    # On TPU, Ray Serve LLM builds the bundles itself: a placement_group_config would override them
    # (and one without TPUs would make it a CPU deployment).
    assert "placement_group_config" not in kw


def test_dev_serves_the_bucket_model_through_the_fuse_mount():
    env = load_environment("dev")
    kw = llm_config_kwargs(env)
    assert kw["model_loading_config"] == {"model_id": "tiny-llama", "model_source": "/gcs/models/tiny-llama"}
    assert kw["engine_kwargs"] == {"tensor_parallel_size": 4, "max_model_len": env.serving.max_model_len}  # its own 2x2
    assert kw["deployment_config"] == {"num_replicas": 1}
    assert kw["runtime_env"]["env_vars"]["VLLM_XLA_CACHE_PATH"] == "/gcs/xla-cache/tiny-llama"


def test_without_the_mount_a_gs_model_is_left_for_ray_to_download():
    kw = llm_config_kwargs(load_environment("dev"), bucket_mount=None)
    assert kw["model_loading_config"]["model_source"] == "gs://my-gcp-project-ray-tpu-dev-ray/models/tiny-llama"
    assert "runtime_env" not in kw


def test_hugging_face_model_id_is_served_under_its_own_name():
    env = env_with(SHAPES["v6e-2x2"][0], model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192, replicas=1)
    kw = llm_config_kwargs(env)
    assert kw["model_loading_config"] == {
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "model_source": "meta-llama/Llama-3.1-8B-Instruct",
    }
    assert kw["engine_kwargs"]["max_model_len"] == 8192
    assert served_model_id(env.serving) == "meta-llama/Llama-3.1-8B-Instruct"


def test_replicas_beyond_the_groups_slices_are_refused():
    with pytest.raises(ConfigError, match=r"serving.replicas: serving.replicas \(2\) is more than slice group serve has slices \(1\)"):
        env_with({**SHAPES["v6e-4x4"][0]}, replicas=2)
    data = yaml.safe_load((ENVIRONMENTS_DIR / "dev.yaml").read_text()) | {"name": "dev"}
    data["slice_groups"][1]["slices"] = 2
    data["serving"]["replicas"] = 2
    assert llm_config_kwargs(parse_environment(data))["deployment_config"] == {"num_replicas": 2}


def test_two_host_2x4_is_refused_with_the_reason():
    env = env_with({"generation": "v6e", "topology": "2x4", "chips_per_host": 4})
    with pytest.raises(ServeConfigError, match="chips_per_host: 8"):
        llm_config_kwargs(env)


def test_environment_without_serving_is_an_error():
    data = yaml.safe_load((ENVIRONMENTS_DIR / "dev.yaml").read_text()) | {"name": "dev"}
    data.pop("serving")
    with pytest.raises(ServeConfigError, match="no serving section"):
        llm_config_kwargs(parse_environment(data))


def test_mounted_path():
    assert mounted_path("gs://b/models/x/", "/gcs") == "/gcs/models/x"
    assert mounted_path("gs://b/a/b/c", "/mnt/bucket/") == "/mnt/bucket/a/b/c"


@pytest.mark.parametrize("env_name", environment_names())
def test_every_shipped_environment_with_serving_has_a_config(env_name):
    env = load_environment(env_name)
    if env.serving is None:
        pytest.skip(f"{env_name} has no serving section")
    kw = llm_config_kwargs(env)
    assert kw["engine_kwargs"]["tensor_parallel_size"] == env.slice_group(env.serving.slice_group).shape.chips


def test_print_config_cli_needs_no_vllm():
    out = subprocess.run(
        [sys.executable, "-m", "jobs.serve", "--env", "dev", "--print-config"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == llm_config_kwargs(load_environment("dev"))
    bad = subprocess.run(
        [sys.executable, "-m", "jobs.serve", "--env", "nope", "--print-config"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "unknown environment" in bad.stderr


def test_importing_jobs_serve_imports_neither_ray_nor_vllm():
    code = "import sys, jobs.serve; print(sorted(m for m in ('ray', 'vllm', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- through Ray Serve LLM itself, where it is importable ----------------------------------------

SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None

needs_serve_llm = pytest.mark.skipif(
    not HAVE_VLLM,
    reason="vLLM is not importable here (ray.serve.llm needs it): these run in .venv-serve "
    "(`.venv-serve/bin/python -m pytest tests/jobs/serve`) or on the TPU image",
)


@needs_serve_llm
@pytest.mark.parametrize("name", SHAPES)
def test_ray_serve_llm_accepts_the_kwargs_and_places_one_slice(name):
    from ray.llm._internal.serve.core.configs.accelerators import TPUAccelerator
    from ray.serve.llm import LLMConfig

    group, accelerator_type, tp, accelerator_config = SHAPES[name]
    env = env_with(group)
    shape = env.slice_group("serve").shape
    config = LLMConfig(**llm_config_kwargs(env))
    engine = config.get_engine_config()
    assert isinstance(engine.accelerator, TPUAccelerator)
    assert engine.tensor_parallel_degree == tp
    assert engine.placement_strategy == "PACK"
    marker = f"accelerator_type:{accelerator_type}"
    if accelerator_config is None:
        # Single host: one one-chip bundle per chip, packed onto the slice's one node.
        assert not engine.accelerator.requires_deferred_placement_group
        assert engine.placement_bundles == [{"TPU": 1, marker: 0.001}] * tp
    else:
        # Multi-host: the replica reserves the slice itself (slice_placement_group), one bundle
        # per host with that host's chips.
        assert engine.accelerator.requires_deferred_placement_group
        assert engine.placement_bundles == [{"TPU": shape.chips_per_host, marker: 0.001}] * shape.hosts


@needs_serve_llm
def test_ray_serve_llm_accepts_the_cpu_kwargs(tmp_path):
    from ray.llm._internal.serve.core.configs.accelerators import CPUAccelerator
    from ray.serve.llm import LLMConfig

    config = LLMConfig(**cpu_llm_config_kwargs(tmp_path, env_vars={"HF_HUB_OFFLINE": "1"}))
    assert isinstance(config.get_engine_config().accelerator, CPUAccelerator)


@needs_serve_llm
def test_build_app_builds_the_openai_application_for_dev(monkeypatch):
    from ray.serve import Application

    monkeypatch.delenv("RAY_TPU_GKE_BUCKET_MOUNT", raising=False)
    assert isinstance(build_app({"env": "dev"}), Application)


def test_build_app_args_are_checked_before_any_import():
    with pytest.raises(Exception, match="unknown environment"):
        build_app({"env": "no-such-env"})


@pytest.mark.vllm
@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is importable here: the checks above ran in this process")
def test_ray_serve_llm_checks_pass_in_the_serving_env():
    """From the main venv (`make test`): the Ray Serve LLM checks above, run in .venv-serve."""
    if not (REPO / ".venv-serve" / ".installed").is_file():
        pytest.skip(".venv-serve is not installed: run scripts/setup_serve_env.sh (make setup)")
    out = subprocess.run(
        [
            str(SERVE_PYTHON),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore",
            "-k",
            "(ray_serve_llm or build_app) and not checks_pass",
            str(Path(__file__).relative_to(REPO)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    tail = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "failed" not in tail and "skipped" not in tail, tail
    assert f"{len(SHAPES) + 3} passed" in tail, tail


def _smoke(args: list[str], path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "jobs.serve_smoke", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_serve_smoke_says_what_is_missing(tmp_path):
    out = _smoke(["--env", "dev"], path=str(tmp_path))  # no gcloud, no kubectl
    assert out.returncode == 2
    assert "gcloud is not on PATH" in out.stderr
    out = _smoke(["--env", "prod"])
    assert out.returncode == 2 and "no serving section" in out.stderr


def test_serve_smoke_times_out_on_a_dead_address():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _smoke(["--env", "dev", "--address", f"http://127.0.0.1:{port}", "--timeout", "1"])
    if importlib.util.find_spec("openai") is None:  # the main venv: says where to run it
        assert out.returncode == 1 and ".venv-serve/bin/python" in out.stderr, out.stderr
    else:
        assert out.returncode == 3 and "not served at" in out.stderr, out.stderr
