"""Causal grouped-query attention, one implementation per platform (ModelConfig.attention):

- `xla`: the reference, in plain JAX: float32 scores [batch, kv, group, seq, seq], masked, softmax.
  What XLA makes of it on CPU, and what the others are checked against.
- `splash`: the Pallas splash-attention kernel for TPU (jax.experimental.pallas.ops.tpu.splash_attention,
  as MaxText and levanter use it): the causal mask is block-sparse, never a tensor, and grouped-query
  attention runs as multi-query attention per key/value head (`make_splash_mqa`: each K/V head is
  read once for its group of query heads, never repeated). Blocks of `block_size(seq)` (512, the
  kernel's and MaxText's default, or the sequence when it is shorter; a multiple of 128 lanes).
  Off TPU it runs in Pallas' interpret mode (slow; for the tests).
- `cudnn`: cuDNN's fused flash attention through `jax.nn.dot_product_attention(implementation="cudnn")`
  (GPU only, bf16 or fp16; grouped-query attention native).
- `auto`: cuDNN when the step is traced on a GPU; else, where the sequence tiles into more than one
  block, splash when it is lowered for TPU (`jax.lax.platform_dependent`, so a step exported for
  TPU from a CPU host gets the kernel) and elsewhere the XLA reference one key block at a time
  (`blockwise_attention`: an online softmax, no [seq, seq] tensor, its scores recomputed in the
  backward pass; a platform-dependent step carries both branches in its StableHLO, so neither may
  hold what the kernel exists to avoid); XLA's materialized reference for shorter sequences.

Only JAX and NumPy: this module loads by path with jobs/train/model.py (bench/gpu_mfu.py).
Shapes: q [batch, seq, heads, head_dim], k and v [batch, seq, kv_heads, head_dim]; out like q.
"""

from __future__ import annotations

import math
from typing import Any

IMPLEMENTATIONS = ("auto", "xla", "splash", "cudnn")
LANES = 128  # splash's blocks are multiples of the TPU's 128 lanes (splash_attention_kernel.py NUM_LANES)
SPLASH_BLOCK = 512  # splash's BlockSizes.get_default() and MaxText's sa_block_* defaults


def block_size(seq: int) -> int | None:
    """Splash's block for a sequence: 512, or the sequence itself below that; None when the sequence
    does not tile into 128-lane blocks (pure)."""
    if seq % LANES:
        return None
    block = min(SPLASH_BLOCK, seq)
    while seq % block:
        block -= LANES
    return block


def xla_attention(q: Any, k: Any, v: Any) -> Any:
    import jax
    import jax.numpy as jnp

    batch, seq, heads, hd = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(batch, seq, kv_heads, heads // kv_heads, hd)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k).astype(jnp.float32) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1).astype(q.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(batch, seq, heads, hd)


def blockwise_attention(q: Any, k: Any, v: Any, block: int) -> Any:
    """The XLA reference's result one key block at a time, with an online softmax (a flash-attention
    loop in plain JAX): never a [seq, seq] tensor, and in the backward pass each block's scores are
    recomputed (`jax.checkpoint`), not saved. What `auto` runs where there is no fused kernel."""
    import jax
    import jax.numpy as jnp

    batch, seq, heads, hd = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    blocks = seq // block
    qg = (q.astype(jnp.float32) / math.sqrt(hd)).reshape(batch, seq, kv_heads, group, hd)
    positions = jnp.arange(seq)
    kb = k.reshape(batch, blocks, block, kv_heads, hd).swapaxes(0, 1)
    vb = v.reshape(batch, blocks, block, kv_heads, hd).swapaxes(0, 1)

    @jax.checkpoint
    def step(carry: Any, xs: Any) -> tuple[Any, None]:
        out, top, total = carry
        kj, vj, j = xs
        scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, kj.astype(jnp.float32))
        keys = j * block + jnp.arange(block)
        scores = jnp.where(positions[:, None] >= keys[None, :], scores, -jnp.inf)
        new_top = jnp.maximum(top, scores.max(axis=-1))
        safe = jnp.where(jnp.isfinite(new_top), new_top, 0.0)
        weights = jnp.exp(scores - safe[..., None])
        scale = jnp.exp(jnp.where(jnp.isfinite(top), top - safe, -jnp.inf))
        out = out * scale[..., None] + jnp.einsum("bkgqs,bskd->bkgqd", weights, vj.astype(jnp.float32))
        return (out, new_top, total * scale + weights.sum(axis=-1)), None

    start = (
        jnp.zeros((batch, kv_heads, group, seq, hd), jnp.float32),
        jnp.full((batch, kv_heads, group, seq), -jnp.inf, jnp.float32),
        jnp.zeros((batch, kv_heads, group, seq), jnp.float32),
    )
    (out, _, total), _ = jax.lax.scan(step, start, (kb, vb, jnp.arange(blocks)))
    out = out / total[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, seq, heads, hd).astype(q.dtype)


def splash_attention(q: Any, k: Any, v: Any, *, interpret: bool) -> Any:
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    batch, seq, heads, hd = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    block = block_size(seq)
    if block is None:
        raise ValueError(f"splash attention needs a sequence length that is a multiple of {LANES}, got {seq}")
    sizes = kernel_lib.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq, seq)) for _ in range(group)])
    kernel = kernel_lib.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)
    # [batch, kv_heads, group, seq, hd] queries (scaled: the kernel does not), [batch, kv_heads, seq, hd] keys and values.
    qs = (q / math.sqrt(hd)).reshape(batch, seq, kv_heads, group, hd).transpose(0, 2, 3, 1, 4)
    ks, vs = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    out = jax.vmap(jax.vmap(kernel))(qs, ks, vs)
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, seq, heads, hd)


def cudnn_attention(q: Any, k: Any, v: Any) -> Any:
    import jax

    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")


def attend(q: Any, k: Any, v: Any, implementation: str) -> Any:
    """Causal attention by `implementation` (one of IMPLEMENTATIONS)."""
    import jax

    if implementation == "xla":
        return xla_attention(q, k, v)
    if implementation == "splash":
        return splash_attention(q, k, v, interpret=jax.default_backend() != "tpu")
    if implementation == "cudnn":
        return cudnn_attention(q, k, v)
    if implementation != "auto":
        raise ValueError(f"attention {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if jax.default_backend() == "gpu" and q.dtype.itemsize == 2:  # cuDNN's flash attention takes bf16 / fp16
        return cudnn_attention(q, k, v)
    block = block_size(q.shape[1])
    if block is None or block == q.shape[1]:  # one block or none: nothing to tile
        return xla_attention(q, k, v)
    return jax.lax.platform_dependent(
        q,
        k,
        v,
        tpu=lambda q, k, v: splash_attention(q, k, v, interpret=False),
        default=lambda q, k, v: blockwise_attention(q, k, v, block),
    )
