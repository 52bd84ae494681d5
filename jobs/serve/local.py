"""Ray Serve LLM on this machine (CPU): the offline environment, and a local Ray + Serve with a model
deployed as the RayService would deploy it (`local_serve`). Used by `make serve-demo`
(jobs.serve.demo), the serving tests and `make bench` (bench/serve_bench.py).

The local Ray runs the RayService's serving path (infra.serving.SERVE_FAST_PATH_ENV: HAProxy, the
vLLM server replica as its own ingress) and nothing more (CPU_SIMULATION_ENV, measured empty).
Importing this module imports neither Ray nor vLLM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from infra.serving import SERVE_FAST_PATH_ENV
from jobs import REPO_ROOT
from jobs.runtime.deadlines import call_with_timeout

WORK = REPO_ROOT / "build" / "serve"
MODEL_DIR = WORK / "tiny-llama"  # the random tiny model (the benchmark's, `--model-dir tiny`)
MODEL_ID = "tiny-llama"
MAX_MODEL_LEN = 512

# What only this machine would need beyond the RayService's settings: nothing, measured. Ray starts
# its workers at niceness 15 (`worker_niceness`, src/ray/common/ray_config_def.h), so the replica and
# its vLLM engine yield to Ray's daemons and to the load client, while `vllm serve` runs at 0. Running
# them at 0 instead (RAY_worker_niceness=0) measured no better on 2 cores and once far worse: the
# client, starved, read whole streams in one burst (README "Serving overhead"). The local Ray runs
# what the pods run; `bench/serve_bench.py --variant NAME:RAY_worker_niceness=0` measures it again.
CPU_SIMULATION_ENV: dict[str, str] = {}


def offline_environment(work: Path = WORK) -> dict[str, str]:
    """Everything Ray and vLLM would write or fetch, pointed at `work` and offline. Set before
    importing ray or vllm; the replicas get the same through runtime_env (jobs.serve.offline_env_vars)."""
    ray_tmp = work / "ray"
    # Ray puts sockets at <tmp>/ray/session_<date>_<pid>/sockets/plasma_store (about 70 more bytes);
    # a unix socket path must fit in 107.
    if len(str(ray_tmp)) > 36:
        ray_tmp = Path(f"/tmp/ray-tpu-gke-serve-{os.getuid()}")
    return {
        "RAY_TMPDIR": str(ray_tmp),
        # Off on purpose: one in-process Ray that lives for the demo, whose only client is this
        # process; the simulated slice (jobs.local) and every cluster we deploy run with a token.
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(work / "hf"),
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "XDG_CACHE_HOME": str(work / "cache"),
        "TOKENIZERS_PARALLELISM": "false",
    }


def apply_offline_environment(work: Path = WORK) -> dict[str, str]:
    env = offline_environment(work)
    os.environ.update(env)
    for key in ("RAY_TMPDIR", "HF_HOME", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    return env


def ensure_model(model_dir: Path = MODEL_DIR) -> Path:
    from jobs.serve.tiny_model import is_complete, make_tiny_model

    if not is_complete(model_dir):
        make_tiny_model(model_dir)
    return model_dir


def _bounded(fn, timeout_s: float, what: str) -> None:
    """Run a teardown step in a thread so that a hang cannot keep the process alive; warn, never raise."""
    try:
        call_with_timeout(fn, timeout_s, what)
    except TimeoutError as err:
        print(f"warning: {err}", file=sys.stderr)
    except Exception as err:
        print(f"warning: {what} failed: {err!r}", file=sys.stderr)


def local_ray_env() -> dict[str, str]:
    """The environment of the local Ray: the RayService's serving path (infra.serving.SERVE_FAST_PATH_ENV)
    and what only this machine needs (CPU_SIMULATION_ENV: nothing, measured)."""
    return {**SERVE_FAST_PATH_ENV, **CPU_SIMULATION_ENV}


@contextlib.contextmanager
def local_serve(
    model_dir: Path,
    *,
    port: int,
    deploy_timeout_s: float,
    num_cpus: int = 4,
    timings: dict[str, float] | None = None,
    model_id: str = MODEL_ID,
    max_model_len: int = MAX_MODEL_LEN,
    ray_env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A local Ray + Serve with the tiny model deployed; yields the base URL. Always tears down.

    `ray_env` (default local_ray_env()) goes into this process's environment before Ray starts: the
    Serve controller, HAProxy and replicas inherit it, and Ray Serve reads it when ray.serve is
    first imported, so call this before anything in the process imports ray.serve."""
    os.environ.update(local_ray_env() if ray_env is None else ray_env)
    import ray
    from ray import serve

    from jobs.serve.app import APP_NAME, build_app, deploy

    timings = {} if timings is None else timings
    t0 = time.monotonic()
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=256 * 2**20,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        timings["ray_start_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        deploy(
            build_app({"model_dir": str(model_dir), "model_id": model_id, "max_model_len": max_model_len}),
            name=APP_NAME,
            timeout_s=deploy_timeout_s,
        )
        timings["deploy_s"] = time.monotonic() - t1
        yield f"http://127.0.0.1:{port}"
    finally:
        signal.alarm(0)  # the teardown has its own bounds; a timeout must not cut it short
        t2 = time.monotonic()
        _bounded(serve.shutdown, 60, "serve.shutdown")
        _bounded(ray.shutdown, 60, "ray.shutdown")
        timings["teardown_s"] = time.monotonic() - t2
