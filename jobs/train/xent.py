"""Next-token cross-entropy without the full logits: the final hidden states are projected onto the
vocabulary a chunk of tokens at a time, each chunk's float32 logits [chunk, vocab] recomputed in the
backward pass instead of kept (`jax.checkpoint` on the chunk), so neither the logits [tokens, vocab]
nor their gradient ever exist whole: about 20 GB at the 1b preset's batch 8 with Llama 3's 128k
vocabulary, otherwise. MaxText tiles the vocabulary the same way (`num_vocab_tiling`), levanter
computes its loss blockwise. The value and the gradients are optax's
`softmax_cross_entropy_with_integer_labels` on the full logits, to float32 rounding.

Only JAX: loads by path with jobs/train/model.py (bench/gpu_mfu.py).
"""

from __future__ import annotations

from typing import Any

CHUNK_TOKENS = 4096  # rows of logits per chunk: 4096 x 128k float32 = 2 GiB at the largest vocabulary


def chunk_for(tokens: int, chunk: int = CHUNK_TOKENS) -> int:
    """The chunk used for `tokens` rows: at most `chunk`, and never more than there are (pure)."""
    return max(1, min(chunk, tokens))


def cross_entropy(hidden: Any, head: Any, labels: Any, *, chunk: int | None = None) -> Any:
    """Mean cross-entropy of `labels` [tokens] under logits `hidden [tokens, d] @ head [d, vocab]`,
    in float32, `chunk` (default CHUNK_TOKENS, read when called) rows at a time (the last chunk
    padded and masked when it does not divide)."""
    import jax
    import jax.numpy as jnp

    tokens = hidden.shape[0]
    size = chunk_for(tokens, chunk or CHUNK_TOKENS)
    chunks = -(-tokens // size)
    pad = chunks * size - tokens
    weights = jnp.concatenate([jnp.ones(tokens, jnp.float32), jnp.zeros(pad, jnp.float32)])
    hidden = jnp.pad(hidden, ((0, pad), (0, 0)))
    labels = jnp.pad(labels, (0, pad))

    @jax.checkpoint  # the chunk's logits are recomputed in the backward pass, never saved
    def chunk_loss(h: Any, y: Any, w: Any) -> Any:
        logits = (h @ head).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, y[:, None], axis=-1)[:, 0]
        return jnp.sum((jax.nn.logsumexp(logits, axis=-1) - picked) * w)

    def body(total: Any, xs: Any) -> tuple[Any, None]:
        return total + chunk_loss(*xs), None

    # Chunk c takes rows c, c + chunks, c + 2 chunks, ...: where the rows are sharded over devices in
    # contiguous blocks, every chunk spans every device, and each step of the scan keeps all busy.
    xs = (
        hidden.reshape(size, chunks, -1).swapaxes(0, 1),
        labels.reshape(size, chunks).swapaxes(0, 1),
        weights.reshape(size, chunks).swapaxes(0, 1),
    )
    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total / tokens
