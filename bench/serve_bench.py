"""Serve overhead: the same vLLM engine driven directly (`vllm.LLM.generate`) and through Ray Serve
LLM's OpenAI endpoint, in the same run, with N concurrent clients. Target: Serve >= 0.8x the
direct throughput.

  .venv-serve/bin/python bench/serve_bench.py [--clients 8] [--requests 4] [--max-tokens 64]
                                               [--model small|tiny] [--json FILE] [--strict]

- direct: one child process runs `LLM.generate` in `--requests` rounds of `--clients` prompts (N
  requests in flight at a time, like N closed-loop clients); TTFT is vLLM's own first-token latency
  of each request (RequestOutput.metrics).
- serve: the demo's local Ray Serve deployment (jobs.serve.demo.local_serve, same engine settings:
  float32, eager, max_model_len 512), N asyncio clients each sending `--requests` streamed
  completions one after another through the `openai` client; TTFT is the client-side time to the
  first streamed token (so it includes HTTP, the proxy and the router).
Both ignore EOS, so every request makes exactly `--max-tokens` tokens; throughput is generated
tokens over wall time, after one warm-up request. The model is random (jobs.serve.tiny_model): `small`
(~10M parameters) gives the engine some work per token; `tiny` (~0.5M) measures almost pure overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jobs.runtime.net import free_port  # noqa: E402
from jobs.serve.demo import MAX_MODEL_LEN, MODEL_ID, WORK, apply_offline_environment, local_serve  # noqa: E402
from jobs.serve.tiny_model import TinyLlamaConfig, is_complete, make_tiny_model, parameter_count  # noqa: E402

TARGET = 0.8
MODELS = {
    "tiny": TinyLlamaConfig(),
    "small": TinyLlamaConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=6),
    "medium": TinyLlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=12),
}
PROMPT = "The model reads tokens, predicts the next token, and the server streams the tokens back to the client."


def model_dir(size: str) -> Path:
    path = WORK / f"bench-{size}"
    if not is_complete(path):
        make_tiny_model(path, cfg=MODELS[size])
    return path


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def summarize(tokens: int, wall_s: float, ttfts: list[float]) -> dict:
    return {
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
    }


# --- direct: vllm.LLM.generate in a child process ----------------------------------------------


def run_direct(path: Path, clients: int, rounds: int, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    t = time.monotonic()
    llm = LLM(model=str(path), max_model_len=MAX_MODEL_LEN, dtype="float32", enforce_eager=True, disable_log_stats=False, seed=0)
    start_s = time.monotonic() - t
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    llm.generate([PROMPT], params, use_tqdm=False)  # warm-up
    tokens, ttfts = 0, []
    t = time.monotonic()
    for _ in range(rounds):
        for out in llm.generate([PROMPT] * clients, params, use_tqdm=False):
            tokens += len(out.outputs[0].token_ids)
            if out.metrics is not None and out.metrics.first_token_latency:
                ttfts.append(out.metrics.first_token_latency)
    result = summarize(tokens, time.monotonic() - t, ttfts)
    result["engine_start_s"] = start_s
    return result


def direct_in_child(path: Path, args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--_direct",
        str(out),
        "--model",
        args.model,
        "--clients",
        str(args.clients),
        "--requests",
        str(args.requests),
        "--max-tokens",
        str(args.max_tokens),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode or not out.exists():
        raise RuntimeError(f"the direct run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


# --- serve: N asyncio clients through the OpenAI endpoint ---------------------------------------


async def _client(client, n: int, max_tokens: int, ttfts: list[float]) -> int:
    tokens = 0
    for _ in range(n):
        t = time.monotonic()
        first = None
        stream = await client.completions.create(
            model=MODEL_ID,
            prompt=PROMPT,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        usage = None
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.monotonic() - t
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        if first is not None:
            ttfts.append(first)
        tokens += usage or 0
    return tokens


async def _serve_load(base_url: str, clients: int, requests: int, max_tokens: int) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="not-needed", timeout=300, max_retries=0)
    await _client(client, 1, max_tokens, [])  # warm-up
    ttfts: list[float] = []
    t = time.monotonic()
    tokens = sum(await asyncio.gather(*(_client(client, requests, max_tokens, ttfts) for _ in range(clients))))
    result = summarize(tokens, time.monotonic() - t, ttfts)
    await client.close()
    return result


def run_serve(path: Path, args: argparse.Namespace) -> dict:
    timings: dict[str, float] = {}
    with local_serve(path, port=free_port(), deploy_timeout_s=args.timeout, timings=timings) as base_url:
        result = asyncio.run(asyncio.wait_for(_serve_load(base_url, args.clients, args.requests, args.max_tokens), timeout=args.timeout))
    result["deploy_s"] = timings.get("deploy_s", float("nan"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (requests in flight)")
    parser.add_argument("--requests", type=int, default=8, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument(
        "--omp-bind",
        default=os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
        help="VLLM_CPU_OMP_THREADS_BIND for both engines (e.g. 0: compute on core 0, leaving the "
        "other cores to the HTTP stack, as a TPU host's CPUs would); default vLLM's auto",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each half")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--strict", action="store_true", help="exit 1 when below the target")
    parser.add_argument("--_direct", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    apply_offline_environment()
    if args.omp_bind:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.omp_bind  # the child and the replicas inherit it
    path = model_dir(args.model)
    if args._direct:
        args._direct.write_text(json.dumps(run_direct(path, args.clients, args.requests, args.max_tokens)))
        return 0

    print(
        f"serve bench: {args.model} model ({parameter_count(MODELS[args.model]) / 1e6:.1f}M parameters), "
        f"{args.clients} concurrent clients x {args.requests} requests x {args.max_tokens} tokens, "
        f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')}",
        flush=True,
    )
    direct = direct_in_child(path, args, WORK / "bench-direct.json")
    print(
        f"  direct  vllm.LLM.generate  {direct['tokens_per_s']:8.1f} tokens/s   TTFT p50 {direct['ttft_p50_s'] * 1e3:6.0f} ms"
        f"  p95 {direct['ttft_p95_s'] * 1e3:6.0f} ms   ({direct['tokens']} tokens in {direct['wall_s']:.1f} s)",
        flush=True,
    )
    serve = run_serve(path, args)
    print(
        f"  serve   Ray Serve LLM      {serve['tokens_per_s']:8.1f} tokens/s   TTFT p50 {serve['ttft_p50_s'] * 1e3:6.0f} ms"
        f"  p95 {serve['ttft_p95_s'] * 1e3:6.0f} ms   ({serve['tokens']} tokens in {serve['wall_s']:.1f} s)",
        flush=True,
    )
    ratio = serve["tokens_per_s"] / direct["tokens_per_s"]
    # Each target on a line of its own ending in `met` or `NOT met` (the bench convention).
    print(f"  throughput ratio serve/direct {ratio:.2f}x (target >= {TARGET}x: {'met' if ratio >= TARGET else 'NOT met'})")
    print(f"  TTFT p50 serve - direct {(serve['ttft_p50_s'] - direct['ttft_p50_s']) * 1e3:+.0f} ms (context)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(args).items() if k != "json" and not k.startswith("_")},
                    "direct": direct,
                    "serve": serve,
                    "ratio": ratio,
                    "target": TARGET,
                },
                indent=2,
                default=str,
            )
        )
    return 1 if args.strict and ratio < TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
