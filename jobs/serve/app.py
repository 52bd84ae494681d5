"""Serve the environment's LLM with Ray Serve LLM (vLLM) on its TPU slice group: an OpenAI-compatible
endpoint (`/v1/models`, `/v1/completions`, `/v1/chat/completions`, streaming) on port 8000.

  serve run jobs.serve:build_app env=dev               # against RAY_ADDRESS (or a local Ray)
  ray job submit --working-dir . -- python -m jobs.serve --env dev
  python -m jobs.serve --env dev --print-config        # the LLMConfig, as JSON; needs no vLLM

The RayService that `python -m infra manifests --env dev` prints imports `jobs.serve:build_app` with
`args: {env: dev}`. `make serve-demo` serves a tiny model on this machine with `build_app` too
(`model_dir=...`: a CPU deployment).

How a TPU slice becomes an LLMConfig is `infra.serving.llm_config_kwargs` (pure, shared with the
RayService manifest).

Importing this module imports neither Ray nor vLLM: only `build_app` and `main` do.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from infra import catalog
from infra.config import ConfigError, load_environment
from infra.serving import (
    APP_NAME,
    BUCKET_MOUNT,
    ENV_VAR,
    SERVE_PORT,
    ServeConfigError,
    bucket_mount_path,
    code_sync_commands,
    cpu_llm_config_kwargs,
    llm_config_kwargs,
    offline_env_vars,
)
from jobs.runtime.deadlines import wait_until


def bucket_mount_here() -> str | None:
    """The bucket mount if this node has it (the RayService mounts it on every pod)."""
    mount = bucket_mount_path()
    return mount if mount and os.path.isdir(mount) else None


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
        return openai_app(
            [
                cpu_llm_config_kwargs(
                    args["model_dir"],
                    model_id=str(args.get("model_id", "tiny-llama")),
                    max_model_len=int(args.get("max_model_len", 512)),
                    env_vars=offline_env_vars(),
                )
            ]
        )
    env = load_environment(str(args.get("env") or os.environ.get(ENV_VAR) or "dev"))
    return openai_app([llm_config_kwargs(env, bucket_mount_here())])


def wait_until_running(name: str, timeout_s: float, poll_s: float = 1.0) -> None:
    """Poll `serve.status()` until the application is RUNNING; raise on failure or timeout."""
    from ray import serve

    last = ["NOT_STARTED"]

    def running() -> bool:
        app = serve.status().applications.get(name)
        last[0] = status = str(app.status) if app else "NOT_STARTED"
        if app is not None and status.endswith(("DEPLOY_FAILED", "UNHEALTHY")):
            raise RuntimeError(f"Serve application {name!r} is {status}: {app.message or '(no message)'}")
        return status.endswith("RUNNING")

    try:
        wait_until(running, timeout_s, f"Serve application {name!r} to be RUNNING", poll_s)
    except TimeoutError:
        raise TimeoutError(f"Serve application {name!r} still {last[0]} after {timeout_s:.0f} s") from None


def deploy(application, name: str = APP_NAME, timeout_s: float = 1800) -> None:
    """serve.run, but bounded: returns once the application is RUNNING, raises after `timeout_s`."""
    from ray import serve

    serve.run_many(
        [serve.RunTarget(target=application, name=name, route_prefix="/")],
        wait_for_ingress_deployment_creation=False,
        wait_for_applications_running=False,
    )
    wait_until_running(name, timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default=os.environ.get(ENV_VAR, "dev"), help="environment name or .yaml path")
    parser.add_argument("--print-config", action="store_true", help="print the LLMConfig kwargs as JSON and exit")
    parser.add_argument(
        "--no-bucket-mount", action="store_true", help="with --print-config: as on a cluster without the bucket's FUSE mount"
    )
    parser.add_argument(
        "--print-code-sync", action="store_true", help="print the gcloud commands that upload infra/ and jobs/ for the RayService, and exit"
    )
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
