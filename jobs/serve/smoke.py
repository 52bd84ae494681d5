"""What `make serve-smoke ENV=dev` runs: query the deployed RayService's OpenAI endpoint.

  .venv-serve/bin/python -m jobs.serve_smoke --env dev [--address URL] [--timeout S]

Without `--address` it gets the cluster's credentials (gcloud), port-forwards the RayService's Serve
service (`<cluster>-serve-serve-svc`, port 8000) to 127.0.0.1, waits until `/v1/models` lists the
environment's model, then asks for one completion with the `openai` client. The port-forward is
always closed. Exit status: 0 passed, 1 a check failed, 2 could not connect, 3 timed out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import urllib.error
import urllib.request

from infra.config import ConfigError, Environment, load_environment
from infra.serving import SERVE_PORT, served_model_id
from jobs.client.port_forward import SubmitError, port_forward
from jobs.runtime.deadlines import Deadline


class SmokeError(RuntimeError):
    pass


def serve_service(env: Environment) -> str:
    from infra.manifests.rayservice import serve_service_name

    return serve_service_name(env)


def serve_port_forward(env: Environment, timeout_s: float = 60):
    """Credentials + `kubectl port-forward` to the Serve service; yields its base URL."""
    return port_forward(env, timeout_s, service=serve_service(env), remote_port=SERVE_PORT)


def wait_for_model(base_url: str, model_id: str, timeout_s: float, poll_s: float = 5.0) -> list[str]:
    """Poll /v1/models until it lists `model_id` (the RayService may still be deploying)."""
    deadline, last = Deadline(timeout_s), "no answer yet"
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as r:
                ids = [m["id"] for m in json.loads(r.read())["data"]]
            if model_id in ids:
                return ids
            last = f"/v1/models lists {ids}, not {model_id!r}"
        except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
            last = f"{err.__class__.__name__}: {getattr(err, 'reason', err)}"
        if deadline.expired():
            raise TimeoutError(f"{model_id!r} not served at {base_url} after {timeout_s:.0f} s ({last})")
        deadline.sleep(poll_s)


def smoke(base_url: str, model_id: str, timeout_s: float) -> dict:
    try:
        from openai import OpenAI
    except ImportError:
        raise SmokeError(
            "the openai client is not installed: run this with .venv-serve/bin/python (`make serve-smoke`), or pip install openai"
        ) from None
    models = wait_for_model(base_url, model_id, timeout_s)
    client = OpenAI(base_url=f"{base_url}/v1", api_key="not-needed", timeout=120, max_retries=2)
    t = time.monotonic()
    c = client.completions.create(model=model_id, prompt="Ray Serve on TPU says", max_tokens=16, temperature=0)
    result = {
        "models": models,
        "text": c.choices[0].text,
        "finish_reason": c.choices[0].finish_reason,
        "completion_tokens": c.usage.completion_tokens if c.usage else 0,
        "latency_s": time.monotonic() - t,
    }
    if not result["completion_tokens"]:
        raise SmokeError(f"the completion returned no tokens: {result}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.serve_smoke", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="dev", help="environment config (infra/environments/<env>.yaml)")
    parser.add_argument("--address", help="the endpoint's base URL (default: port-forward the RayService)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the model to be served")
    args = parser.parse_args(argv)
    try:
        env = load_environment(args.env)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if env.serving is None:
        print(f"error: environment {env.name!r} has no serving section: nothing to smoke-test", file=sys.stderr)
        return 2
    model_id = served_model_id(env.serving)
    try:
        with contextlib.nullcontext(args.address.rstrip("/")) if args.address else serve_port_forward(env) as url:
            print(f"serve-smoke: waiting for {model_id} at {url} (up to {args.timeout:.0f} s) ...", flush=True)
            result = smoke(url, model_id, args.timeout)
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except TimeoutError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except Exception as err:  # the openai client's errors, one line each
        print(f"error: serve-smoke failed: {err.__class__.__name__}: {err}", file=sys.stderr)
        return 1
    print(
        f"serve-smoke: models {', '.join(result['models'])}; completion {result['text']!r} "
        f"({result['completion_tokens']} tokens, {result['latency_s'] * 1e3:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
