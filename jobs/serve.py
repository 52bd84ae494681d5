"""Serve the environment's LLM with Ray Serve LLM (vLLM) on its TPU slice group: an OpenAI-compatible
endpoint (`/v1/models`, `/v1/completions`, `/v1/chat/completions`, streaming) on port 8000.

  serve run jobs.serve:build_app env=dev               # against RAY_ADDRESS (or a local Ray)
  ray job submit --working-dir . -- python -m jobs.serve --env dev
  python -m jobs.serve --env dev --print-config        # the LLMConfig, as JSON; needs no vLLM

The RayService that `python -m infra manifests --env dev` prints imports `jobs.serve:build_app` with
`args: {env: dev}`. `make serve-demo` serves a tiny model on this machine with `build_app` too
(`model_dir=...`: a CPU deployment).

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

Importing this module imports neither Ray nor vLLM: only `build_app` and `main` do.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from infra import catalog
from infra.config import ConfigError, Environment, Serving, load_environment

APP_NAME = "llm"
SERVE_PORT = 8000
# Where the RayService mounts the environment's bucket (GCS FUSE) in every Ray pod.
BUCKET_MOUNT = "/gcs"
BUCKET_MOUNT_ENV_VAR = "RAY_TPU_GKE_BUCKET_MOUNT"  # override it for other clusters
XLA_CACHE_DIR = "xla-cache"
# Where the serving cluster imports this repo from: gs://BUCKET/<CODE_PREFIX>/{infra,jobs}, read
# through the bucket mount (`--print-code-sync` prints the upload).
CODE_PREFIX = "code/ray-tpu-gke"
CODE_PACKAGES = ("infra", "jobs")
# The environment `jobs.serve:app` serves when it is imported without builder args.
ENV_VAR = "RAY_TPU_GKE_ENV"
# The vLLM TPU engine (Python 3.12 only; pulls tpu-inference, JAX and libtpu): installed by the
# RayService's runtime env unless the serving image already has it.
VLLM_TPU_REQUIREMENT = "vllm-tpu==0.29.0"
SERVE_PYTHON = "py312"

# What a local CPU replica needs to stay offline and inside the repo's build dir.
OFFLINE_ENV_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "VLLM_CACHE_ROOT", "VLLM_CPU_KVCACHE_SPACE",
                    "VLLM_NO_USAGE_STATS", "XDG_CACHE_HOME", "DO_NOT_TRACK", "RAY_USAGE_STATS_ENABLED",
                    "TOKENIZERS_PARALLELISM", "VLLM_CPU_OMP_THREADS_BIND")


class ServeConfigError(ValueError):
    """The environment's serving section cannot be turned into a Ray Serve LLM deployment."""


# --- pure: the environment config -> LLMConfig keyword arguments ---------------------------------


def served_model_id(serving: Serving) -> str:
    """The name clients put in `model`: the last path part of a gs:// model, else the HF id."""
    if serving.model.startswith("gs://"):
        return serving.model.rstrip("/").rsplit("/", 1)[-1]
    return serving.model


def mounted_path(gs_uri: str, bucket_mount: str) -> str:
    """gs://BUCKET/models/x -> <mount>/models/x (the mount is the bucket's root)."""
    _, _, path = gs_uri[len("gs://"):].partition("/")
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


def cpu_llm_config_kwargs(model_dir: str | Path, model_id: str = "tiny-llama", max_model_len: int = 512,
                          env_vars: dict[str, str] | None = None, num_replicas: int = 1) -> dict[str, Any]:
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


def bucket_mount_here() -> str | None:
    """The bucket mount if this node has it (the RayService mounts it on every pod)."""
    mount = os.environ.get(BUCKET_MOUNT_ENV_VAR, BUCKET_MOUNT)
    return mount if mount and os.path.isdir(mount) else None


def serve_image(env: Environment) -> str:
    """The image of the serving cluster: `serving.image` where the config has one, else Ray's own
    Python 3.12 image (vllm-tpu is cp312-only) with vllm-tpu installed by the runtime env."""
    explicit = getattr(env.serving, "image", None)
    if explicit:
        return explicit
    return f"rayproject/ray:{env.ray.version}-{SERVE_PYTHON}"


def serve_pip(env: Environment) -> list[str]:
    """What the serving app's runtime env installs: vllm-tpu unless the image is the user's own."""
    return [] if getattr(env.serving, "image", None) else [VLLM_TPU_REQUIREMENT]


def code_sync_commands(env: Environment, repo: Path = Path(__file__).resolve().parents[1]) -> list[list[str]]:
    """The uploads that put this repo's packages where the RayService imports them from."""
    return [["gcloud", "storage", "rsync", "--recursive", "--delete-unmatched-destination-objects",
             "--exclude", r".*__pycache__.*|.*\.pyc$", str(repo / pkg), f"gs://{env.bucket_name}/{CODE_PREFIX}/{pkg}"]
            for pkg in CODE_PACKAGES]


# --- the Serve application ----------------------------------------------------------------------


def openai_app(configs: list[dict[str, Any]]):
    """The OpenAI-compatible Serve application for LLMConfig kwargs (imports Ray Serve LLM: vLLM)."""
    from ray.serve.llm import LLMConfig, build_openai_app

    return build_openai_app({"llm_configs": [LLMConfig(**kw) for kw in configs]})


def build_app(args: dict[str, Any]):
    """The Serve application builder `serveConfigV2` and `serve run` name.

    args: `env` (an environment name or .yaml path; default $RAY_TPU_GKE_ENV or dev), or
    `model_dir` (a local HF model served on CPU; with `model_id`, `max_model_len`).
    """
    args = dict(args or {})
    if args.get("model_dir"):
        return openai_app([cpu_llm_config_kwargs(
            args["model_dir"], model_id=str(args.get("model_id", "tiny-llama")),
            max_model_len=int(args.get("max_model_len", 512)), env_vars=offline_env_vars())])
    env = load_environment(str(args.get("env") or os.environ.get(ENV_VAR) or "dev"))
    return openai_app([llm_config_kwargs(env, bucket_mount_here())])


def __getattr__(name: str):
    # `jobs.serve:app` (serve run, import paths) builds the $RAY_TPU_GKE_ENV app on first access,
    # so that importing the module stays cheap.
    if name == "app":
        return build_app({})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def wait_until_running(name: str, timeout_s: float, poll_s: float = 1.0) -> None:
    """Poll `serve.status()` until the application is RUNNING; raise on failure or timeout."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    status = "NOT_STARTED"
    while time.monotonic() < deadline:
        app = serve.status().applications.get(name)
        status = str(app.status) if app else "NOT_STARTED"
        if status.endswith("RUNNING"):
            return
        if status.endswith("DEPLOY_FAILED") or status.endswith("UNHEALTHY"):
            raise RuntimeError(f"Serve application {name!r} is {status}: {app.message or '(no message)'}")
        time.sleep(poll_s)
    raise TimeoutError(f"Serve application {name!r} still {status} after {timeout_s:.0f} s")


def deploy(application, name: str = APP_NAME, timeout_s: float = 1800) -> None:
    """serve.run, but bounded: returns once the application is RUNNING, raises after `timeout_s`."""
    from ray import serve

    serve.run_many([serve.RunTarget(target=application, name=name, route_prefix="/")],
                   wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    wait_until_running(name, timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default=os.environ.get(ENV_VAR, "dev"), help="environment name or .yaml path")
    parser.add_argument("--print-config", action="store_true", help="print the LLMConfig kwargs as JSON and exit")
    parser.add_argument("--no-bucket-mount", action="store_true",
                        help="with --print-config: as on a cluster without the bucket's FUSE mount")
    parser.add_argument("--print-code-sync", action="store_true",
                        help="print the gcloud commands that upload infra/ and jobs/ for the RayService, and exit")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the application to run")
    args = parser.parse_args(argv)
    try:
        env = load_environment(args.env)
        if args.print_code_sync:
            print("\n".join(shlex.join(cmd) for cmd in code_sync_commands(env)))
            return 0
        if args.print_config:
            mount = None if args.no_bucket_mount else BUCKET_MOUNT
            print(json.dumps(llm_config_kwargs(env, mount), indent=2))
            return 0
        kwargs = llm_config_kwargs(env, bucket_mount_here())
    except (ConfigError, ServeConfigError, catalog.CatalogError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import ray
    from ray import serve

    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
    # Serve's proxies listen on 127.0.0.1 unless told otherwise; a running Serve keeps its options.
    serve.start(http_options={"host": "0.0.0.0", "port": SERVE_PORT})
    try:
        deploy(openai_app([kwargs]), timeout_s=args.timeout)
    except (RuntimeError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"serving {kwargs['model_loading_config']['model_id']} as application {APP_NAME!r} on port {SERVE_PORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
