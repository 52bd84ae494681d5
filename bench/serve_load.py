"""The serve bench's load: vLLM's own benchmark client (`vllm bench serve`, run through
bench/vllm_cli.py) against an OpenAI-compatible server, and the checks its saved result must pass.

  .venv-serve/bin/python bench/serve_load.py --base-url http://127.0.0.1:8000 --model tiny-llama \
      --tokenizer build/serve/bench-small [--concurrency 4] [--num-prompts 16] [--input-len 64] [--output-len 64]

The client sends `--num-prompts` streamed completions (`--backend openai`: /v1/completions, its
random dataset: prompts of `--input-len` random tokens, no download) with at most `--concurrency`
in flight, after `--concurrency` warm-up requests, and writes its result as JSON. It asks for exactly
`--output-len` tokens with `ignore_eos`, and counts what the server says it generated: the `usage`
of the stream's last chunk (it sends `stream_options.include_usage`,
vllm/benchmarks/lib/endpoint_request_func.py:184-187 and 245-246). Only when a response has no
usage does it re-tokenize the text instead (vllm/benchmarks/serve.py:595-610), so `probe_usage`
first checks that the server reports usage at all. A load fails (LoadError, exit 1 here) when any
request failed or any request got fewer tokens than asked.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROBE_PROMPT = "usage probe"
VLLM_CLI = Path(__file__).resolve().parent / "vllm_cli.py"
# The metrics kept from the client's result (its own names), in ms except the throughput.
METRICS = (
    "output_throughput",
    "median_ttft_ms",
    "p95_ttft_ms",
    "median_itl_ms",
    "p95_itl_ms",
    "median_tpot_ms",
    "p95_tpot_ms",
)


class LoadError(RuntimeError):
    """A load that did not run, or whose result does not count (failed or short requests)."""


@dataclass(frozen=True)
class Load:
    concurrency: int
    num_prompts: int
    input_len: int = 64
    output_len: int = 64
    seed: int = 0


def client_command(base_url: str, model_id: str, tokenizer: Path, load: Load, result: Path) -> list[str]:
    """`vllm bench serve ...` for one load, writing its result (per request too) to `result`."""
    return [
        sys.executable,
        str(VLLM_CLI),
        "bench",
        "serve",
        *("--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions"),
        *("--model", model_id, "--tokenizer", str(tokenizer)),
        *("--dataset-name", "random", "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len)),
        "--ignore-eos",
        *("--temperature", "0", "--seed", str(load.seed)),
        *("--max-concurrency", str(load.concurrency), "--num-prompts", str(load.num_prompts)),
        # Warm-up at the measured concurrency: the engine's first batch of a new size is slow on CPU.
        *("--num-warmups", str(load.concurrency)),
        *("--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95"),
        *("--save-result", "--save-detailed", "--result-dir", str(result.parent), "--result-filename", result.name),
        "--disable-tqdm",
    ]


def probe_usage(base_url: str, model_id: str, output_len: int, timeout_s: float = 120) -> int:
    """One streamed completion like the client's: the server must end it with `usage` (else the
    client would count tokens by re-tokenizing text). Returns the completion tokens it reported."""
    body = json.dumps(
        {
            "model": model_id,
            "prompt": PROBE_PROMPT,
            "max_tokens": output_len,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    usage = None
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    usage = json.loads(line[len("data:") :]).get("usage") or usage
    except (OSError, urllib.error.URLError, json.JSONDecodeError) as err:
        raise LoadError(f"the usage probe of {base_url}/v1/completions failed: {err}") from None
    if not usage or not isinstance(usage.get("completion_tokens"), int):
        raise LoadError(
            f"{base_url} does not report usage at the end of a stream (stream_options.include_usage): "
            "vLLM's client would then count tokens by re-tokenizing text, and the bench counts only what "
            "the server reports"
        )
    if usage["completion_tokens"] < output_len:
        raise LoadError(
            f"{base_url} generated {usage['completion_tokens']} tokens when asked for {output_len} (ignore_eos): fewer tokens than asked"
        )
    return int(usage["completion_tokens"])


def check_result(result: dict[str, Any], load: Load, label: str) -> None:
    """Every request completed, and each got exactly the tokens asked for (by the server's count)."""
    failed = load.num_prompts - int(result.get("completed", 0))
    if failed:
        errors = [e for e in result.get("errors", []) if e]
        raise LoadError(
            f"{label}: {failed} of {load.num_prompts} requests failed at concurrency {load.concurrency}"
            + (f"; the first error: {errors[0][:300]}" if errors else "")
        )
    lens = result.get("output_lens") or []
    short = [n for n in lens if n < load.output_len]
    total, want = int(result.get("total_output_tokens", 0)), load.num_prompts * load.output_len
    if short or len(lens) != load.num_prompts or total < want:
        raise LoadError(
            f"{label} returned fewer tokens than asked at concurrency {load.concurrency}: "
            f"{total} tokens for {load.num_prompts} requests of {load.output_len} (ignore_eos), "
            f"{len(short)} requests short (fewest: {min(short) if short else min(lens, default=0)}), "
            "counted from the usage the server reported; a throughput over missing tokens would not compare"
        )


def run_load(base_url: str, model_id: str, tokenizer: Path, load: Load, result: Path, *, label: str, timeout_s: float) -> dict[str, Any]:
    """Run the client once (bounded by `timeout_s`, its process group killed past it), check its
    result and return the metrics (METRICS, plus the load and the client's duration)."""
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    log = result.with_suffix(".log")
    with log.open("w") as out:
        proc = subprocess.Popen(
            client_command(base_url, model_id, tokenizer, load, result), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise LoadError(
                f"{label}: vLLM's client did not finish within {timeout_s:.0f} s at concurrency {load.concurrency} (log: {log})"
            ) from None
    if proc.returncode or not result.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise LoadError(f"{label}: vLLM's client exited with status {proc.returncode} and no result; its last lines: " + " | ".join(tail))
    data = json.loads(result.read_text())
    check_result(data, load, label)
    return {**{k: float(data[k]) for k in METRICS}, "duration_s": float(data["duration"]), "load": asdict(load)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True, help="the served model id")
    parser.add_argument("--tokenizer", type=Path, required=True, help="a local tokenizer directory (the random dataset's)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--result", type=Path, default=Path("build/serve/bench/load.json"))
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the client")
    args = parser.parse_args(argv)
    load = Load(args.concurrency, args.num_prompts, args.input_len, args.output_len)
    try:
        probe_usage(args.base_url, args.model, args.output_len, timeout_s=args.timeout)
        metrics = run_load(
            args.base_url, args.model, args.tokenizer, load, args.result.resolve(), label=args.base_url, timeout_s=args.timeout
        )
    except LoadError as err:
        print(f"serve load: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
