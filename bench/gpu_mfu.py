"""The training step on one NVIDIA GPU, change by change: MFU at MaxText's count against the device's
peak (`make bench` where there is a GPU; the 1b preset's target is >= 40%).

    python bench/gpu_mfu.py                    # the sweep below, one subprocess per variant, <= 10 min
    python bench/gpu_mfu.py --variant final --preset 1b --batch 16 [--flags off]   # one of them

The sweep, cumulatively at batch 8 on the 1b preset (XLA reads its flags once per process, and an
out-of-memory variant must not end the sweep, hence a process each):
  before         the step as it was: XLA's materialized attention, the whole layer recomputed
                 (`full`), the logits whole (one chunk), no compiler flags
  chunked-loss   + the loss a chunk of tokens at a time (jobs/train/xent.py)
  cudnn          + cuDNN's flash attention
  remat          + the preset's remat policy (`minimal`)
  final          + the compiler flags (jobs/train/xla_flags.py): the step `jobs.train` runs on a GPU
then `final` at batch 16 and 32, `final` without the flags at the best batch, and the 125m preset
at batch 32. Casting the weights once before the scan, and bf16 compute, are in every variant.

No Ray, no pydantic: it loads jobs/train/model.py (and the modules beside it) and xla_flags.py by
path, and uses the model's own step code (`make_optimizer`, `train_step`), exactly what each Ray
Train worker compiles. Tokens are random (the step's cost does not depend on them).

Each variant prints `GPU_BENCH {json}` (preset, batch, variant, mfu at MaxText's count, the old
non-causal count's beside it, step time, peak memory, jax's version); one that runs out of memory
prints `OOM` and `GPU_BENCH {..., "oom": true}`. Peak: NVIDIA's dense BF16 figure for the device
(`PEAKS`: H100 SXM and H200 SXM 989 TFLOP/s, per their datasheets; the 1979 figure is with
sparsity), or `--peak-tflops`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

TRAIN = Path(__file__).resolve().parent.parent / "jobs" / "train"
# Dense BF16 peak FLOP/s by device kind (jax's device_kind), from NVIDIA's datasheets (read
# 2026-12-03: "H200 Tensor Core GPU" and "H100 Tensor Core GPU" pages; the sparse figure is twice).
PEAKS = {"NVIDIA H200": 989e12, "NVIDIA H100 80GB HBM3": 989e12}
TARGET_MFU = 0.40
SWEEP_S = 600.0  # the whole sweep, compiles included
VARIANTS = {  # name: (attention, remat or None for the preset's, whole logits, flags)
    "before": ("xla", "full", True, False),
    "chunked-loss": ("xla", "full", False, False),
    "cudnn": ("cudnn", "full", False, False),
    "remat": ("cudnn", None, False, False),
    "final": ("cudnn", None, False, True),
}


def load(name: str):
    """jobs/train/<name>.py by path (a module named `name`: the model's siblings load the same way)."""
    spec = importlib.util.spec_from_file_location(name, TRAIN / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_variant(args: argparse.Namespace) -> int:
    """One variant in this process: its flags must be in the environment before JAX starts."""
    attention, remat, whole_logits, flags = VARIANTS[args.variant]
    flags = flags and args.flags == "on"
    if flags:
        load("xla_flags").apply(os.environ, "gpu")
    import jax
    import jax.numpy as jnp
    import numpy as np

    model = load("model")
    cfg = replace(model.PRESETS[args.preset], attention=attention)
    cfg = replace(cfg, remat=remat) if remat else cfg
    device = jax.devices()[0]
    peak = args.peak_tflops * 1e12 if args.peak_tflops else PEAKS.get(device.device_kind)
    tokens_per_step = args.batch * cfg.seq_len
    if whole_logits:
        model.xent_lib.CHUNK_TOKENS = tokens_per_step  # one chunk: the logits whole, as before
    result = {"preset": args.preset, "batch": args.batch, "variant": args.variant, "flags": flags, "jax": jax.__version__}
    result |= {"device": device.device_kind, "attention": cfg.attention, "remat": cfg.remat, "whole_logits": whole_logits}
    try:
        optimizer = model.make_optimizer(3e-4, warmup_steps=10, total_steps=1000)
        step = jax.jit(model.train_step(optimizer, cfg, jnp.bfloat16), donate_argnums=(0, 1))
        params = jax.tree.map(jnp.asarray, model.init_params(cfg, 0))
        opt_state = jax.jit(optimizer.init)(params)
        tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (args.batch, cfg.seq_len + 1), dtype=np.int32))
        begin = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens)
        loss.block_until_ready()
        compile_s = time.perf_counter() - begin
        begin = time.perf_counter()
        for _ in range(args.steps):
            params, opt_state, loss = step(params, opt_state, tokens)
        loss.block_until_ready()
        step_s = (time.perf_counter() - begin) / args.steps
    except Exception as err:  # XLA's out-of-memory is a RuntimeError / XlaRuntimeError
        if "RESOURCE_EXHAUSTED" not in str(err) and "out of memory" not in str(err).lower():
            raise
        print(f"  {args.variant} {args.preset} batch {args.batch}: OOM")
        print("GPU_BENCH " + json.dumps({**result, "oom": True}), flush=True)
        return 0
    tokens_per_s = tokens_per_step / step_s
    flops = model.flops_per_token(cfg) * tokens_per_s
    stats = device.memory_stats() or {}
    result |= {
        "seq_len": cfg.seq_len,
        "compile_s": compile_s,
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "tflops_per_s": flops / 1e12,
        "peak_tflops": peak / 1e12 if peak else None,
        "mfu": flops / peak if peak else None,
        "mfu_noncausal": model.flops_per_token_noncausal(cfg) * tokens_per_s / peak if peak else None,
        "peak_memory_gib": stats.get("peak_bytes_in_use", 0) / 2**30,
        "loss": float(loss),
        "oom": False,
    }
    mfu = result["mfu"]
    print(
        f"  {args.variant} {args.preset} batch {args.batch}: step {step_s * 1e3:.1f} ms (first {compile_s:.0f} s), "
        f"{tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%} (the old non-causal count: {result['mfu_noncausal']:.1%}), "
        f"peak memory {result['peak_memory_gib']:.1f} GiB"
        if mfu is not None
        else f"  {args.variant}: unknown peak for {device.device_kind} (--peak-tflops)"
    )
    print("GPU_BENCH " + json.dumps(result), flush=True)
    return 0


def sweep(args: argparse.Namespace) -> int:
    plan = [(v, "1b", 8, "on") for v in VARIANTS] + [("final", "1b", 16, "on"), ("final", "1b", 32, "on")]
    results: list[dict] = []
    deadline = time.monotonic() + SWEEP_S

    def one(variant: str, preset: str, batch: int, flags: str) -> dict | None:
        left = deadline - time.monotonic()
        if left < 30:
            print(f"  {variant} {preset} batch {batch}: skipped, the sweep's {SWEEP_S:.0f} s are spent")
            return None
        cmd = [sys.executable, __file__, "--variant", variant, "--preset", preset, "--batch", str(batch), "--flags", flags]
        cmd += ["--steps", str(args.steps), *(["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else [])]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            print(f"  {variant} {preset} batch {batch}: still compiling or running when the sweep's time ran out")
            return None
        lines = [line for line in proc.stdout.splitlines() if line.startswith("GPU_BENCH ")]
        sys.stdout.write("".join(line + "\n" for line in proc.stdout.splitlines() if not line.startswith("GPU_BENCH ")))
        if proc.returncode or not lines:
            print(f"  {variant} {preset} batch {batch}: failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            return None
        print(lines[-1], flush=True)
        found = json.loads(lines[-1][len("GPU_BENCH ") :])
        results.append(found)
        return found

    for variant, preset, batch, flags in plan:
        one(variant, preset, batch, flags)
    finals = [r for r in results if r["variant"] == "final" and r["preset"] == "1b" and not r["oom"] and r.get("mfu")]
    best = max(finals, key=lambda r: r["mfu"], default=None)
    if best:
        one("final", "1b", best["batch"], "off")
    small = one("final", "125m", 32, "on")
    print(f"gpu bench: jax {results[0]['jax'] if results else '?'}")
    if best:
        verdict = "met" if best["mfu"] >= TARGET_MFU else "NOT met"
        print(f"  1b step MFU at MaxText's count, best batch {best['batch']}: {best['mfu']:.1%} (target >= {TARGET_MFU:.0%}): {verdict}")
    else:
        print(f"  1b step MFU at MaxText's count: no final variant ran (target >= {TARGET_MFU:.0%}): NOT met")
    ran = small is not None and not small["oom"]
    print(f"  125m at batch 32 runs: {'yes' if ran else 'no'} (target: it runs): {'met' if ran else 'NOT met'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), default=None, help="one variant (default: the whole sweep)")
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--flags", choices=("on", "off"), default="on", help="the compiler flags, in a variant that has them")
    parser.add_argument("--steps", type=int, default=5, help="timed steps, after one to compile")
    parser.add_argument("--peak-tflops", type=float, default=None)
    args = parser.parse_args(argv)
    return run_variant(args) if args.variant else sweep(args)


if __name__ == "__main__":
    sys.exit(main())
