"""Serving overhead: Ray Serve LLM against vLLM's own OpenAI server (`vllm serve`), the same model,
dtype, max model length and engine flags, both loaded by vLLM's own benchmark client.

  .venv-serve/bin/python bench/serve_bench.py [--concurrencies 1,4,8] [--repeats 3] [--model small|tiny|medium]
      [--input-len 64] [--output-len 64] [--num-prompts N] [--omp-bind 0] [--variant NAME:K=V,...]
      [--json FILE] [--strict] [--timeout S]

- `vllm serve MODEL_DIR` (through bench/vllm_cli.py) with the engine flags of our LLMConfig: the
  `engine_kwargs` of infra.serving.cpu_llm_config_kwargs, what jobs.serve.build_app deploys, as flags.
- Ray Serve LLM: jobs.serve.local.local_serve in a child process, the RayService's serving path
  (infra.serving.SERVE_FAST_PATH_ENV), as the pods run it (jobs.serve.local.CPU_SIMULATION_ENV is empty).
- The load: bench/serve_load.py, `vllm bench serve` (random prompts, `--ignore-eos`, streamed
  completions, tokens counted from the server's usage; a short request fails the bench) at each
  concurrency, `--num-prompts` requests (default 4 per slot, at least 8) after warm-ups.
- Interleaved: both servers stay up, and every (repeat, concurrency) runs one server, then the other,
  seconds apart, the order alternating between repeats, so that other work on this 2-core machine
  (tests, builds) hits both alike. An idle server costs the other a little CPU: the bench measures
  and prints each one's idle CPU. Both get the same VLLM_CPU_OMP_THREADS_BIND (`--omp-bind`, default
  vLLM's auto: the worker on core 0, core 1 left to the engine's scheduler and the HTTP side).
- Reported per concurrency: output throughput, TTFT, ITL and TPOT (p50, p95), median and min-max
  over the repeats; `vllm.LLM.generate` (offline, no HTTP) once, as context. Targets, one line each
  ending in `met` or `NOT met`: Ray Serve's throughput >= 0.8x vllm serve's (median of per-repeat
  ratios) and TTFT p50 overhead <= +50 ms (median of per-repeat differences), at every concurrency.
- `--variant NAME:K=V,...` adds a Ray Serve LLM server whose local Ray gets K=V on top of ours
  (`--variant ray-defaults`: every setting back to Ray's default): how README "Serving overhead"
  measures each setting.
ITL is per streamed chunk as vLLM's client sees it; TPOT ((latency - TTFT) / (tokens - 1)) does not
depend on how tokens are grouped into chunks. Default run: about 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serve_load import Load, LoadError, probe_usage, run_load  # noqa: E402
from bench.serve_servers import RAY_DEFAULTS, BenchError, Server, idle_cpu, start_ray, start_vllm  # noqa: E402
from jobs.serve.local import MAX_MODEL_LEN, MODEL_ID, WORK, apply_offline_environment, local_ray_env  # noqa: E402
from jobs.serve.tiny_model import TinyLlamaConfig, is_complete, make_tiny_model, parameter_count  # noqa: E402

THROUGHPUT_TARGET = 0.8  # Ray Serve LLM / vllm serve output throughput, at least
TTFT_TARGET_MS = 50.0  # Ray Serve LLM - vllm serve TTFT p50, at most
MODELS = {
    "tiny": TinyLlamaConfig(),
    "small": TinyLlamaConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=6),
    "medium": TinyLlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=12),
}
VLLM, RAY = "vllm serve", "Ray Serve LLM"


def model_dir(size: str) -> Path:
    path = WORK / f"bench-{size}"
    if not is_complete(path):
        make_tiny_model(path, cfg=MODELS[size])
    return path


def concurrencies(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers, e.g. 1,4,8")
    return values


def variant(text: str) -> tuple[str, dict[str, str]]:
    """NAME:K=V,K=V (settings on top of ours), or `ray-defaults`."""
    if text == "ray-defaults":
        return text, dict(RAY_DEFAULTS)
    name, _, rest = text.partition(":")
    pairs = [p.partition("=") for p in rest.split(",") if p]
    if not name or name in (VLLM, RAY) or not pairs or any(not k or not sep for k, sep, _ in pairs):
        raise argparse.ArgumentTypeError(f"{text!r} is neither NAME:KEY=VALUE[,KEY=VALUE...] nor ray-defaults")
    env = {k: v for k, _, v in pairs}
    merged = {**local_ray_env(), **env}
    # Ray refuses the deployment otherwise (ray/serve/_private/build_app.py:145-146, Ray 2.60.0):
    # the LLM server as its own ingress is routed to by HAProxy alone.
    if merged["RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"] == "1" and merged["RAY_SERVE_ENABLE_HA_PROXY"] != "1":
        raise argparse.ArgumentTypeError(
            f"{text!r}: RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1 needs RAY_SERVE_ENABLE_HA_PROXY=1 (Ray Serve refuses "
            "an ingress request router without HAProxy); set both to 0 to measure Ray Serve's Python proxy"
        )
    return name, env


# --- the offline figure (context): vllm.LLM.generate in a child process ------------------------------


def run_offline(path: Path, load: Load) -> dict[str, float]:
    import random

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from infra.serving import cpu_llm_config_kwargs

    engine = cpu_llm_config_kwargs(path, model_id=MODEL_ID, max_model_len=MAX_MODEL_LEN)["engine_kwargs"]
    llm = LLM(model=str(path), seed=load.seed, **engine)
    vocab = llm.get_tokenizer().vocab_size
    rng = random.Random(load.seed)
    params = SamplingParams(max_tokens=load.output_len, temperature=0, ignore_eos=True)
    batch = [TokensPrompt(prompt_token_ids=[rng.randrange(vocab) for _ in range(load.input_len)]) for _ in range(load.concurrency)]
    llm.generate(batch, params, use_tqdm=False)  # warm-up: the first batch of a size is slow on CPU
    tokens, t = 0, time.monotonic()
    for _ in range(max(1, load.num_prompts // load.concurrency)):  # closed loop, `concurrency` at a time
        tokens += sum(len(out.outputs[0].token_ids) for out in llm.generate(batch, params, use_tqdm=False))
    wall = time.monotonic() - t
    return {"output_throughput": tokens / wall, "tokens": tokens, "wall_s": wall}


def offline_in_child(path: Path, load: Load, out: Path, timeout_s: float) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--_offline", str(out), "--model", path.name.removeprefix("bench-")]
    cmd += ["--concurrencies", str(load.concurrency), "--num-prompts", str(load.num_prompts)]
    cmd += ["--input-len", str(load.input_len), "--output-len", str(load.output_len)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BenchError(f"vllm.LLM.generate did not finish within {timeout_s:.0f} s") from None
    if proc.returncode or not out.is_file():
        raise BenchError(f"vllm.LLM.generate failed (status {proc.returncode}): " + " | ".join(proc.stderr.strip().splitlines()[-5:]))
    return json.loads(out.read_text())


# --- the report ------------------------------------------------------------------------------------


def spread(xs: list[float], fmt: str) -> str:
    return f"{format(statistics.median(xs), fmt)} ({format(min(xs), fmt)}-{format(max(xs), fmt)})"


def summarize(runs: dict[str, dict[int, list[dict]]], servers: list[str], conc: list[int]) -> list[dict[str, Any]]:
    """Per concurrency: each server's medians and ranges, and the per-repeat ratios/differences to vllm serve."""
    out = []
    for c in conc:
        base = runs[VLLM][c]
        row: dict[str, Any] = {"concurrency": c, "servers": {}}
        for name in servers:
            rs = runs[name][c]
            row["servers"][name] = {k: [r[k] for r in rs] for k in rs[0] if k != "load"}
            if name != VLLM:
                row["servers"][name]["throughput_ratio"] = [
                    r["output_throughput"] / b["output_throughput"] for r, b in zip(rs, base, strict=True)
                ]
                row["servers"][name]["ttft_p50_overhead_ms"] = [
                    r["median_ttft_ms"] - b["median_ttft_ms"] for r, b in zip(rs, base, strict=True)
                ]
        out.append(row)
    return out


def targets(summary: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    lines = []
    for row in summary:
        s, c = row["servers"][RAY], row["concurrency"]
        ratio, over = statistics.median(s["throughput_ratio"]), statistics.median(s["ttft_p50_overhead_ms"])
        lines.append(
            (
                f"throughput at concurrency {c}: {RAY} / {VLLM} {ratio:.2f}x median of {len(s['throughput_ratio'])} repeats "
                f"({min(s['throughput_ratio']):.2f}-{max(s['throughput_ratio']):.2f}x), target >= {THROUGHPUT_TARGET}x",
                ratio >= THROUGHPUT_TARGET,
            )
        )
        lines.append(
            (
                f"TTFT p50 overhead at concurrency {c}: {over:+.0f} ms median ({min(s['ttft_p50_overhead_ms']):+.0f} to "
                f"{max(s['ttft_p50_overhead_ms']):+.0f} ms), target <= +{TTFT_TARGET_MS:.0f} ms",
                over <= TTFT_TARGET_MS,
            )
        )
    return lines


def target_line(text: str, ok: bool) -> str:
    return f"  {text}: {'met' if ok else 'NOT met'}"


def print_summary(summary: list[dict[str, Any]], servers: list[str], load_of: dict[int, Load]) -> None:
    print("\nmedian (min-max) over the repeats; ms except throughput")
    for row in summary:
        c = row["concurrency"]
        print(f"concurrency {c} ({load_of[c].num_prompts} requests):")
        print(f"  {'':18s}{'output tok/s':>22s}{'TTFT p50':>16s}{'TTFT p95':>16s}{'ITL p50':>18s}{'ITL p95':>18s}{'TPOT p50':>18s}")
        for name in servers:
            s = row["servers"][name]
            print(
                f"  {name:18s}{spread(s['output_throughput'], '.1f'):>22s}{spread(s['median_ttft_ms'], '.0f'):>16s}"
                f"{spread(s['p95_ttft_ms'], '.0f'):>16s}{spread(s['median_itl_ms'], '.1f'):>18s}{spread(s['p95_itl_ms'], '.1f'):>18s}"
                f"{spread(s['median_tpot_ms'], '.1f'):>18s}"
                + (f"  {statistics.median(s['throughput_ratio']):.2f}x" if name != VLLM else "")
            )


# --- the run -----------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, path: Path, servers: dict[str, Server], result_dir: Path) -> dict[str, dict[int, list[dict]]]:
    names = list(servers)
    runs: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in args.concurrencies} for n in names}
    for r in range(args.repeats):
        order = names if r % 2 == 0 else names[::-1]  # A, B then B, A: drift over time hits both alike
        for c in args.concurrencies:
            for name in order:
                load = Load(c, args.num_prompts or max(8, 4 * c), args.input_len, args.output_len, seed=r)
                m = run_load(
                    servers[name].url,
                    MODEL_ID,
                    path,
                    load,
                    result_dir / f"{servers[name].slug}-c{c}-r{r}.json",
                    label=name,
                    timeout_s=args.timeout,
                )
                runs[name][c].append(m)
                print(
                    f"  repeat {r + 1} concurrency {c:<3d} {name:18s}{m['output_throughput']:8.1f} tok/s   TTFT p50 {m['median_ttft_ms']:5.0f} "
                    f"p95 {m['p95_ttft_ms']:5.0f} ms   ITL p50 {m['median_itl_ms']:5.1f} p95 {m['p95_itl_ms']:5.1f} ms   "
                    f"TPOT p50 {m['median_tpot_ms']:5.1f} ms",
                    flush=True,
                )
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrencies", type=concurrencies, default=[1, 4, 8], help="requests in flight, e.g. 1,4,8")
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, 21), metavar="N", help="interleaved repeats (1-20)")
    parser.add_argument("--num-prompts", type=int, default=None, help="requests per run (default: 4 per slot, at least 8)")
    parser.add_argument("--input-len", type=int, default=64, help="prompt tokens")
    parser.add_argument("--output-len", type=int, default=64, help="tokens generated per request (ignore_eos)")
    parser.add_argument("--model", choices=sorted(MODELS), default="small", help="the random model's size (jobs.serve.tiny_model)")
    parser.add_argument(
        "--omp-bind",
        default=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        help="VLLM_CPU_OMP_THREADS_BIND for every engine (default vLLM's auto: the worker on core 0 of 2)",
    )
    parser.add_argument(
        "--variant", type=variant, action="append", default=[], help="another Ray Serve LLM: NAME:KEY=VALUE,... or ray-defaults"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each server start and each client run")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    parser.add_argument("--_offline", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.input_len + args.output_len > MAX_MODEL_LEN or min(args.input_len, args.output_len) < 1:
        parser.error(f"--input-len + --output-len must be between 2 and the max model length, {MAX_MODEL_LEN}")
    if args.num_prompts is not None and args.num_prompts < 1:
        parser.error("--num-prompts must be at least 1")

    apply_offline_environment()
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.omp_bind  # every server and the offline child inherit it
    path = model_dir(args.model)
    if args._offline:
        c = args.concurrencies[0]
        args._offline.write_text(json.dumps(run_offline(path, Load(c, args.num_prompts or 8 * c, args.input_len, args.output_len))))
        return 0
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # tear the servers down on SIGTERM too
    try:
        return run(args, path)
    except (BenchError, LoadError) as err:
        print(f"serve bench: error: {err}", file=sys.stderr, flush=True)
        return 1


def run(args: argparse.Namespace, path: Path) -> int:
    t0 = time.monotonic()
    result_dir = WORK / "bench"
    result_dir.mkdir(parents=True, exist_ok=True)
    load_of = {c: Load(c, args.num_prompts or max(8, 4 * c), args.input_len, args.output_len) for c in args.concurrencies}
    print(
        f"serve bench: {args.model} model ({parameter_count(MODELS[args.model]) / 1e6:.1f}M parameters, float32, max_model_len "
        f"{MAX_MODEL_LEN}); {args.input_len} prompt tokens, {args.output_len} out (ignore_eos); concurrencies "
        f"{','.join(map(str, args.concurrencies))}; {args.repeats} repeats, {VLLM} and {RAY} both up and run in turn "
        f"(order alternating per repeat); load: vLLM's own client (vllm bench serve); VLLM_CPU_OMP_THREADS_BIND={args.omp_bind} for both",
        flush=True,
    )
    top = max(args.concurrencies)
    offline = offline_in_child(path, Load(top, 8 * top, args.input_len, args.output_len), result_dir / "offline.json", args.timeout)
    print(f"  context: vllm.LLM.generate (offline, no HTTP) at {top} in flight: {offline['output_throughput']:.1f} tok/s", flush=True)
    variants = {RAY: {}, **dict(args.variant)}
    with contextlib.ExitStack() as stack:
        servers = {VLLM: stack.enter_context(start_vllm(path, result_dir, args.timeout))}
        for name, env in variants.items():
            servers[name] = stack.enter_context(start_ray(path, result_dir, args.timeout, name, {**local_ray_env(), **env}))
        for name, server in servers.items():
            probe_usage(server.url, MODEL_ID, args.output_len, timeout_s=args.timeout)
            print(f"  {name:18s} up in {server.start_s:4.0f} s at {server.url}", flush=True)
        runs = measure(args, path, servers, result_dir)
        time.sleep(5)  # the engines' scheduler loops spin a little after their last request
        idle = {name: idle_cpu(server, seconds=5) for name, server in servers.items()}
    summary = summarize(runs, list(servers), args.concurrencies)
    print_summary(summary, list(servers), load_of)
    print("  idle, each server costs the others: " + ", ".join(f"{name} {pct:.0f}%" for name, pct in idle.items()) + " of a core")
    print(f"  context: vllm.LLM.generate at {top} in flight: {offline['output_throughput']:.1f} tok/s (no HTTP, no streaming)")
    lines = targets(summary)
    for text, ok in lines:
        print(target_line(text, ok))
    print(f"serve bench: {time.monotonic() - t0:.0f} s")
    if args.json:
        settings = {name: {**local_ray_env(), **env} for name, env in variants.items()}
        report = {
            "args": {k: v for k, v in vars(args).items() if k not in ("json", "_offline")},
            "offline": offline,
            "idle_cpu_percent": idle,
        }
        report.update(ray_env=settings, summary=summary, targets=[{"target": t, "met": ok} for t, ok in lines])
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 1 if args.strict and not all(ok for _, ok in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
