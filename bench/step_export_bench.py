"""What the training step becomes where this machine cannot run it, read from the compiler's own output
(`make bench`, CPU only):

1. The 1b preset's step exported for TPU (`jax.export`, platforms ["tpu"], shapes only, no mesh: JAX
   lowers Pallas TPU kernels on a CPU host): it holds the splash kernel, no tensor with two
   sequence-length dimensions (the materialized [.., seq, seq] scores), and no float32 tensor of
   batch x seq x vocab / 2 elements or more anywhere (the full logits or their gradient, saved
   residuals included). At sequence length 4096: the preset's own 2048 is also its d_model, and a
   [seq, seq] tensor could not be told from a [seq, d_model] one.
2. `cost_analysis()` FLOPs of a CPU compile of the 1b shrunk to 2 layers and seq 512, per remat
   policy: `full` recomputes each layer's forward in the backward pass, `minimal` only its
   elementwise work, so the step's FLOPs fall by the forward FLOPs of the projections whose output
   the backward pass needs (2 x tokens x their parameters: all but the MLP's down projection, whose
   output feeds only the residual sum). XLA's cost analysis counts a while loop's body once, so the
   scanned layers count as one: the expected fall is one layer's. The measured fall against it is
   the target's ratio (>= 0.9x).

Each target's line ends in `met` or `NOT met`; `STEP_EXPORT {json}` carries the numbers.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BATCH = 8
SEQ = 4096  # no other dimension of the 1b model (d_model 2048, d_ff 8192, kv 512, head 64, vocab 128256)


def exported_for_tpu(cfg, batch: int) -> str:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jobs.train.model import make_optimizer, shapes, train_step

    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes(cfg), is_leaf=lambda s: isinstance(s, tuple))
    optimizer = make_optimizer(3e-4, 10, 1000)
    opt_state = jax.eval_shape(optimizer.init, abstract)
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq_len + 1), np.int32)
    step = jax.jit(train_step(optimizer, cfg, jnp.bfloat16))
    return jax.export.export(step, platforms=["tpu"])(abstract, opt_state, tokens).mlir_module()


def tensor_types(text: str) -> list[tuple[tuple[int, ...], str]]:
    """Every ranked tensor type in StableHLO text: (shape, element type)."""
    out = []
    for dims, dtype in re.findall(r"tensor<((?:\d+x)+)([a-z]+\d*)>", text):
        out.append((tuple(int(d) for d in dims.rstrip("x").split("x")), dtype))
    return out


def step_flops(cfg, batch: int) -> float:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jobs.train.model import make_optimizer, shapes, train_step

    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes(cfg), is_leaf=lambda s: isinstance(s, tuple))
    optimizer = make_optimizer(3e-4, 10, 1000)
    opt_state = jax.eval_shape(optimizer.init, abstract)
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq_len + 1), np.int32)
    compiled = jax.jit(train_step(optimizer, cfg)).lower(abstract, opt_state, tokens).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return float(analysis["flops"])


def main() -> int:
    from jobs.train.model import PRESETS, with_overrides

    cfg = with_overrides(PRESETS["1b"], seq_len=SEQ)
    print(f"step export bench: the 1b preset's step ({cfg.n_layers} layers, seq {cfg.seq_len}, vocab {cfg.vocab}), batch {BATCH}")
    began = time.perf_counter()
    text = exported_for_tpu(cfg, BATCH)
    export_s = time.perf_counter() - began
    types = tensor_types(text)
    splash = "tpu_custom_call" in text and "splash" in text.lower()
    seq_by_seq = [t for t in types if sum(1 for d in t[0] if d == cfg.seq_len) >= 2]
    logits_limit = BATCH * cfg.seq_len * cfg.vocab // 2
    big_f32 = sorted({t for t in types if t[1] == "f32" and _elements(t[0]) >= logits_limit}, key=lambda t: -_elements(t[0]))
    print(f"  exported for TPU in {export_s:.0f} s: {len(text) / 1e6:.1f} MB of StableHLO, {len(types)} tensor types")
    print(f"  splash kernel in the TPU step: {'yes' if splash else 'no'} (target: yes): {'met' if splash else 'NOT met'}")
    print(
        f"  tensors with two seq-length ({cfg.seq_len}) dimensions: {len(seq_by_seq)} (target 0): {'met' if not seq_by_seq else 'NOT met'}"
    )
    print(
        f"  float32 tensors of >= batch x seq x vocab / 2 = {logits_limit:,} elements: {len(big_f32)} "
        f"{[t[0] for t in big_f32[:3]]} (target 0): {'met' if not big_f32 else 'NOT met'}"
    )

    small = with_overrides(PRESETS["1b"], n_layers=2, seq_len=512)
    flops = {policy: step_flops(replace(small, remat=policy, attention="xla"), BATCH) for policy in ("full", "minimal")}
    d, hd = small.d_model, small.head_dim
    # wq, wo, wk, wv, w_gate, w_up: the projections whose outputs the backward pass reads again.
    recomputed = d * small.n_heads * hd * 2 + 2 * d * small.n_kv_heads * hd + 2 * d * small.d_ff
    expected = 2.0 * BATCH * small.seq_len * recomputed  # one layer: the scan's body, counted once
    ratio = (flops["full"] - flops["minimal"]) / expected
    print(
        f"  cost_analysis FLOPs of the 2-layer, seq-512 step on CPU: full remat {flops['full'] / 1e12:.2f} T, minimal "
        f"{flops['minimal'] / 1e12:.2f} T; the fall {(flops['full'] - flops['minimal']) / 1e12:.2f} T against the projections' "
        f"recomputed forward {expected / 1e12:.2f} T = {ratio:.2f}x (target >= 0.9x): {'met' if ratio >= 0.9 else 'NOT met'}"
    )
    result = {
        "export_s": export_s,
        "splash": splash,
        "seq_by_seq_tensors": len(seq_by_seq),
        "big_f32_tensors": [list(t[0]) for t in big_f32],
        "flops": flops,
        "expected_fall": expected,
        "fall_ratio": ratio,
    }
    print("STEP_EXPORT " + json.dumps(result), flush=True)
    return 0


def _elements(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


if __name__ == "__main__":
    sys.exit(main())
