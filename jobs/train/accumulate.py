"""Gradient accumulation: the loss and gradients of a batch as the mean over `accum` micro-batches,
one at a time, so a run on fewer slices keeps its global batch without holding more per chip
(`jobs.train.elastic`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def micro_batches(tokens: Any, accum: int) -> Any:
    """[batch, ...] -> [accum, batch / accum, ...], micro-batch j taking rows j, j + accum, ...:
    every device's block of the batch holds rows of every micro-batch, so each one spreads over
    all devices as the whole batch does (a plain reshape would put micro-batch 0 on the first
    devices only)."""
    import jax.numpy as jnp

    batch = tokens.shape[0]
    if batch % accum:
        raise ValueError(f"a batch of {batch} rows does not split into {accum} micro-batches")
    return jnp.swapaxes(tokens.reshape(batch // accum, accum, *tokens.shape[1:]), 0, 1)


def value_and_grad(loss: Callable[..., Any], accum: int) -> Callable[..., tuple[Any, Any]]:
    """`jax.value_and_grad(loss)` over its second argument (the tokens) split into `accum`
    micro-batches: the mean loss and the mean gradient, accumulated in float32 by a scan (equal
    micro-batches, so the mean of means is the batch's mean)."""
    import jax
    import jax.numpy as jnp

    single = jax.value_and_grad(loss)
    if accum == 1:
        return single

    def accumulated(params: Any, tokens: Any, *args: Any) -> tuple[Any, Any]:
        def body(carry, micro):
            total, grads = carry
            value, g = single(params, micro, *args)
            return (total + value, jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        (total, grads), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro_batches(tokens, accum))
        return total / accum, jax.tree.map(lambda g, p: (g / accum).astype(p.dtype), grads, params)

    return accumulated
