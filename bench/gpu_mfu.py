"""The training step of a model preset in plain JAX on one accelerator, in bf16: MFU against the
device's peak (`make bench` on a machine with an NVIDIA GPU; the 1B preset's target is >= 40%).

    python bench/gpu_mfu.py [--preset 1b] [--batch 8] [--steps 10] [--peak-tflops 989]

No Ray, no pydantic: it loads jobs/train/model.py by path (not the `jobs` package, whose driver
code needs both) and uses its own step code (`make_optimizer`, `train_step`), exactly what each
Ray Train worker compiles. Parameters float32, matmuls bf16, remat as the preset says; tokens are
random (the step's cost does not depend on them). MFU = model FLOPs per token (the preset's,
PaLM's accounting) x tokens per second / peak.

Peak: NVIDIA's dense BF16 Tensor Core figure for the device (`PEAKS`: H100 SXM and H200 SXM
989 TFLOP/s, per their datasheets; the 1979 figure is with sparsity), or `--peak-tflops`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

MODEL_PY = Path(__file__).resolve().parent.parent / "jobs" / "train" / "model.py"
# Dense BF16 peak FLOP/s by device kind (jax's device_kind), from NVIDIA's datasheets (read
# 2026-12-03: "H200 Tensor Core GPU" and "H100 Tensor Core GPU" pages; the sparse figure is twice).
PEAKS = {"NVIDIA H200": 989e12, "NVIDIA H100 80GB HBM3": 989e12}


def load_model():
    spec = importlib.util.spec_from_file_location("model", MODEL_PY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the preset's")
    parser.add_argument("--steps", type=int, default=10, help="timed steps, after one to compile")
    parser.add_argument("--peak-tflops", type=float, default=None)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    model = load_model()
    cfg = model.PRESETS[args.preset]
    if args.seq_len:
        cfg = model.with_overrides(cfg, seq_len=args.seq_len)
    device = jax.devices()[0]
    peak = args.peak_tflops * 1e12 if args.peak_tflops else PEAKS.get(device.device_kind)
    print(
        f"gpu bench: {args.preset} ({model.param_count(cfg) / 1e9:.2f}B parameters) on {device.device_kind}, batch {args.batch} x {cfg.seq_len}"
    )

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

    tokens_per_s = args.batch * cfg.seq_len / step_s
    flops = model.flops_per_token(cfg) * tokens_per_s
    mfu = flops / peak if peak else None
    result = {
        "preset": args.preset,
        "device": device.device_kind,
        "batch": args.batch,
        "seq_len": cfg.seq_len,
        "compile_s": compile_s,
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "tflops_per_s": flops / 1e12,
        "peak_tflops": peak / 1e12 if peak else None,
        "mfu": mfu,
        "loss": float(loss),
    }
    print(
        f"  step {step_s * 1e3:.1f} ms (first {compile_s:.1f} s with compilation), {tokens_per_s:,.0f} tokens/s, {flops / 1e12:.1f} TFLOP/s"
    )
    print(
        f"  MFU {mfu:.1%} of {peak / 1e12:.0f} TFLOP/s (target >= 40%: {'met' if mfu >= 0.4 else 'NOT met'})"
        if mfu
        else "  MFU: unknown peak (--peak-tflops)"
    )
    print("GPU_BENCH " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
