"""What `make serve-demo` runs: a model trained on the simulated slice and exported (`jobs.export`),
served by the real vLLM engine through Ray Serve LLM on this machine (127.0.0.1), queried with the
`openai` client, then torn down.

  .venv-serve/bin/python -m jobs.serve_demo [--model-dir DIR] [--json-summary FILE] [--hold] [--timeout S]

`make serve-demo` first trains and exports the model to build/serve/trained-llama when it is not
there (`python -m jobs.demo --export DIR`, in the main venv: this one has no JAX). `--model-dir
tiny` serves the random tiny Llama instead (jobs.serve.tiny_model, written on the fly).

Steps: start a local Ray with its files under build/serve (jobs.serve.local: the RayService's
serving path, HAProxy and direct streaming), deploy `jobs.serve:build_app` (a CPU deployment of the
model), then query /v1/models, a completion, a chat completion, a streamed chat
completion and a 16-token greedy completion with its token ids (what the tests compare with the JAX
model's own greedy decode), send three bad requests (unknown model, over-long prompt, malformed
JSON) that must get 4xx answers, and check that the server still answers afterwards. Prints a
summary; always shuts Serve and Ray down.

Every wait is bounded: `--timeout` caps the whole run (a SIGALRM ends it and still tears down).
`--hold` (for tests) writes the summary, then keeps serving until stdin closes or a line arrives.
Exit status: 0 all checks passed, 1 a check failed, 3 timed out.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jobs import REPO_ROOT
from jobs.runtime.net import free_port
from jobs.serve.local import MAX_MODEL_LEN, MODEL_DIR, MODEL_ID, WORK, apply_offline_environment, ensure_model, local_serve

TRAINED_DIR = WORK / "trained-llama"  # what `make serve-demo` trains and exports
GREEDY_PROMPT = "A TPU slice is"
GREEDY_TOKENS = 16


class DemoTimeout(Exception):
    pass


def served_model(model_dir: Path) -> tuple[str, int]:
    """The model id (the directory's name) and the longest context (its config's positions)."""
    config = json.loads((model_dir / "config.json").read_text())
    return model_dir.name, int(config.get("max_position_embeddings", MAX_MODEL_LEN))


def query(base_url: str, model_id: str = MODEL_ID, timeout_s: float = 60) -> dict[str, Any]:
    """The OpenAI-client round trip: models, completion, chat, streamed chat, greedy token ids."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="not-needed", timeout=timeout_s, max_retries=0)
    out: dict[str, Any] = {"models": [m.id for m in client.models.list().data]}

    c = client.completions.create(model=model_id, prompt="The quick brown fox", max_tokens=12, temperature=0)
    out["completion"] = {
        "text": c.choices[0].text,
        "finish_reason": c.choices[0].finish_reason,
        "completion_tokens": c.usage.completion_tokens if c.usage else None,
    }

    chat = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hello! How are you?"}], max_tokens=12, temperature=0
    )
    out["chat"] = {
        "content": chat.choices[0].message.content,
        "role": chat.choices[0].message.role,
        "finish_reason": chat.choices[0].finish_reason,
    }

    t = time.monotonic()
    first, chunks, pieces = None, 0, []
    stream = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Count with me"}], max_tokens=16, temperature=0, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.monotonic() - t
            chunks += 1
            pieces.append(chunk.choices[0].delta.content)
    out["stream"] = {"chunks": chunks, "text": "".join(pieces), "ttft_s": first}

    # vLLM's own extensions: the token ids, and no stop at EOS (the reference decode has none).
    g = client.completions.create(
        model=model_id,
        prompt=GREEDY_PROMPT,
        max_tokens=GREEDY_TOKENS,
        temperature=0,
        logprobs=1,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = g.choices[0].model_dump()
    out["greedy"] = {
        "prompt": GREEDY_PROMPT,
        "prompt_token_ids": choice.get("prompt_token_ids"),
        "token_ids": choice.get("token_ids"),
        "token_logprobs": (choice.get("logprobs") or {}).get("token_logprobs"),
        "text": choice.get("text"),
    }
    return out


def bad_requests(base_url: str, model_id: str = MODEL_ID, max_model_len: int = MAX_MODEL_LEN, timeout_s: float = 60) -> dict[str, Any]:
    """Three requests the server must refuse with 4xx, then one it must still answer."""
    import httpx

    url = f"{base_url}/v1/completions"
    out: dict[str, Any] = {}
    with httpx.Client(timeout=timeout_s) as http:
        r = http.post(url, json={"model": "no-such-model", "prompt": "hi", "max_tokens": 4})
        out["unknown_model"] = {"status": r.status_code, "body": r.text[:300]}
        long_prompt = "one two three four " * (max_model_len // 2)  # well past max_model_len tokens
        r = http.post(url, json={"model": model_id, "prompt": long_prompt, "max_tokens": 4})
        out["too_long"] = {"status": r.status_code, "body": r.text[:300]}
        r = http.post(url, content=f'{{"model": "{model_id}", "prompt": '.encode(), headers={"content-type": "application/json"})
        out["malformed_json"] = {"status": r.status_code, "body": r.text[:300]}
        r = http.post(url, json={"model": model_id, "prompt": "Still there?", "max_tokens": 4, "temperature": 0})
        out["after"] = {"status": r.status_code, "text": r.json()["choices"][0]["text"] if r.status_code == 200 else r.text[:300]}
    return out


def checks(summary: dict[str, Any]) -> list[str]:
    """What must hold; the failures, as sentences."""
    q, bad = summary.get("queries", {}), summary.get("bad_requests", {})
    model_id = summary.get("model_id", MODEL_ID)
    failures = []
    if model_id not in q.get("models", []):
        failures.append(f"/v1/models does not list {model_id}: {q.get('models')}")
    if len(q.get("greedy", {}).get("token_ids") or []) != GREEDY_TOKENS:
        failures.append(f"the greedy completion did not return {GREEDY_TOKENS} token ids: {q.get('greedy')}")
    if not q.get("completion", {}).get("completion_tokens"):
        failures.append(f"the completion produced no tokens: {q.get('completion')}")
    if not q.get("chat", {}).get("content"):
        failures.append(f"the chat completion is empty: {q.get('chat')}")
    if q.get("stream", {}).get("chunks", 0) < 2:
        failures.append(f"the stream had fewer than 2 chunks: {q.get('stream')}")
    for name in ("unknown_model", "too_long", "malformed_json"):
        status = bad.get(name, {}).get("status")
        if not (isinstance(status, int) and 400 <= status < 500):
            failures.append(f"bad request {name} got {status}, not a 4xx: {bad.get(name)}")
    if bad.get("after", {}).get("status") != 200:
        failures.append(f"the server did not answer after the bad requests: {bad.get('after')}")
    return failures


def _alarm(signum, frame):
    raise DemoTimeout()


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def _hold(timeout_s: float) -> None:
    """Keep serving until stdin gives a line or closes (or `timeout_s`)."""
    done = threading.Event()

    def wait_for_stdin() -> None:
        sys.stdin.readline()
        done.set()

    threading.Thread(target=wait_for_stdin, daemon=True).start()
    done.wait(timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.serve_demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir",
        default=str(TRAINED_DIR),
        help=f"the Hugging Face model directory to serve (default {TRAINED_DIR.relative_to(REPO_ROOT)}; `tiny`: the random tiny model)",
    )
    parser.add_argument("--json-summary", type=Path, help="also write the summary here (JSON)")
    parser.add_argument("--hold", action="store_true", help="after the checks, serve until stdin closes")
    parser.add_argument("--hold-timeout", type=float, default=300, help="longest --hold, seconds")
    parser.add_argument("--timeout", type=float, default=600, help="longest the whole run may take, seconds")
    parser.add_argument("--deploy-timeout", type=float, default=300, help="longest wait for the app to run")
    args = parser.parse_args(argv)

    apply_offline_environment()
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGTERM, _terminate)
    signal.alarm(int(args.timeout))
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    model_dir = MODEL_DIR if args.model_dir == "tiny" else Path(args.model_dir).resolve()
    if args.model_dir != "tiny" and not (model_dir / "config.json").is_file():
        print(
            f"serve-demo: error: no model at {model_dir}: `make serve-demo` trains and exports one "
            f"(python -m jobs.demo --export {model_dir}); `--model-dir tiny` serves a random one",
            file=sys.stderr,
        )
        return 2
    summary: dict[str, Any] = {"model_dir": str(model_dir), "timings": timings}
    status = 1
    try:
        t = time.monotonic()
        if args.model_dir == "tiny":
            ensure_model()
        model_id, max_model_len = served_model(model_dir)
        summary.update(model_id=model_id, max_model_len=max_model_len)
        timings["model_s"] = time.monotonic() - t
        port = free_port()
        print(f"serve-demo: deploying {model_id} ({model_dir}) on 127.0.0.1:{port} ...", flush=True)
        with local_serve(
            model_dir, port=port, deploy_timeout_s=args.deploy_timeout, timings=timings, model_id=model_id, max_model_len=max_model_len
        ) as base_url:
            summary["base_url"] = base_url
            print(f"serve-demo: ready in {timings['deploy_s']:.0f} s; querying {base_url}/v1", flush=True)
            t = time.monotonic()
            summary["queries"] = query(base_url, model_id)
            summary["bad_requests"] = bad_requests(base_url, model_id, max_model_len)
            timings["queries_s"] = time.monotonic() - t
            summary["failures"] = checks(summary)
            status = 0 if not summary["failures"] else 1
            _print_summary(summary)
            if args.json_summary:
                _write_json(args.json_summary, summary)
            if args.hold:
                print("serve-demo: holding; close stdin to stop", flush=True)
                _hold(args.hold_timeout)
    except DemoTimeout:
        print(f"serve-demo: error: still running after {args.timeout:.0f} s; tearing down", file=sys.stderr, flush=True)
        status = 3
    except Exception as err:  # the demo reports, tears down and exits non-zero
        print(f"serve-demo: error: {err.__class__.__name__}: {err}", file=sys.stderr, flush=True)
        summary.setdefault("failures", []).append(f"{err.__class__.__name__}: {err}")
        if args.json_summary and not args.json_summary.exists():
            _write_json(args.json_summary, summary)
        status = 1
    finally:
        signal.alarm(0)
    print(
        f"serve-demo: torn down in {timings.get('teardown_s', 0):.0f} s; total {time.monotonic() - t0:.0f} s; "
        f"{'OK' if status == 0 else 'FAILED'}",
        flush=True,
    )
    return status


def _write_json(path: Path, summary: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(path)  # readers never see half a file


def _print_summary(s: dict[str, Any]) -> None:
    q, bad, t = s["queries"], s["bad_requests"], s["timings"]
    print(f"  models:            {', '.join(q['models'])}")
    print(
        f"  completion:        {q['completion']['text']!r} ({q['completion']['completion_tokens']} tokens, "
        f"{q['completion']['finish_reason']})"
    )
    print(f"  chat:              {q['chat']['content']!r}")
    ttft = q["stream"]["ttft_s"]
    print(
        f"  streamed chat:     {q['stream']['chunks']} chunks, first after {ttft * 1e3:.0f} ms"
        if ttft is not None
        else "  streamed chat:     no chunks"
    )
    g = q.get("greedy", {})
    print(f"  greedy (16 tok):   {g.get('prompt', '')!r} -> {g.get('text')!r}")
    print(
        "  bad requests:      "
        + ", ".join(f"{k} -> {bad[k]['status']}" for k in ("unknown_model", "too_long", "malformed_json"))
        + f"; then a completion -> {bad['after']['status']}"
    )
    print(f"  timings:           Ray {t['ray_start_s']:.0f} s, deploy {t['deploy_s']:.0f} s, queries {t['queries_s']:.1f} s")
    for f in s["failures"]:
        print(f"  FAILED: {f}")


if __name__ == "__main__":
    sys.exit(main())
