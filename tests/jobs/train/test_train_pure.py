"""The model and the training arithmetic, on one CPU device (real JAX, no cluster)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jobs.train.config import mfu
from jobs.train.data import synthetic_tokens
from jobs.train.model import (
    ModelConfig,
    flops_per_token,
    flops_per_token_noncausal,
    fsdp_spec,
    init_params,
    loss_fn,
    param_count,
    param_specs,
)

CFG = ModelConfig(vocab=64, seq_len=16, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64)


def test_param_count_matches_the_parameters():
    params = init_params(CFG, 0)
    assert param_count(CFG) == sum(x.size for x in jax.tree.leaves(params))
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))
    same = init_params(CFG, 0)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(same), strict=False))


def test_flops_per_token_is_six_per_matmul_parameter_plus_attention():
    d, f, L, T, V = CFG.d_model, CFG.d_ff, CFG.n_layers, CFG.seq_len, CFG.vocab
    kv = CFG.n_kv_heads * CFG.head_dim  # grouped-query attention: k and v are narrower than q
    # MaxText's count (maxtext_utils calculate_tflops_training_per_device): causal attention halved.
    assert flops_per_token(CFG) == 6 * (L * (2 * d * d + 2 * d * kv + 3 * d * f) + d * V) + 6 * L * d * T
    assert flops_per_token_noncausal(CFG) == 6 * (L * (2 * d * d + 2 * d * kv + 3 * d * f) + d * V) + 12 * L * d * T


def test_fsdp_shards_the_largest_divisible_dim_never_the_layer_axis():
    assert fsdp_spec((64, 32), 4, stacked=False) == jax.sharding.PartitionSpec("fsdp", None)
    assert fsdp_spec((8, 32, 96), 4, stacked=True) == jax.sharding.PartitionSpec(None, None, "fsdp")
    assert fsdp_spec((8, 3), 4, stacked=True) == jax.sharding.PartitionSpec()  # too small: replicated
    assert fsdp_spec((64,), 1, stacked=False) == jax.sharding.PartitionSpec()
    specs = param_specs(init_params(CFG, 0), 4)
    assert set(specs) == {"embed", "layers", "norm_f", "lm_head"}


def test_synthetic_rows_are_deterministic_arithmetic_sequences():
    rows = synthetic_tokens(np.arange(50), seq_len=32, vocab=64, noise=0.0)
    assert rows.shape == (50, 33) and rows.dtype == np.int32
    steps = np.diff(rows, axis=1) % 64
    assert (steps == steps[:, :1]).all() and ((steps[:, 0] >= 1) & (steps[:, 0] <= 7)).all()
    assert np.array_equal(rows, synthetic_tokens(np.arange(50), seq_len=32, vocab=64, noise=0.0))
    noisy = synthetic_tokens(np.arange(50), seq_len=32, vocab=64)
    assert 0 < (noisy != rows).mean() < 0.2


def test_the_model_learns_the_synthetic_data_on_one_device():
    params = jax.tree.map(jnp.asarray, init_params(CFG, 0))
    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def step(params, state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, CFG)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(40):
        tokens = jnp.asarray(synthetic_tokens(np.arange(i * 16, (i + 1) * 16), CFG.seq_len, CFG.vocab))
        params, state, loss = step(params, state, tokens)
        losses.append(float(loss))
    assert losses[0] == pytest.approx(np.log(CFG.vocab), rel=0.1)  # starts near uniform
    assert np.mean(losses[-5:]) < 0.7 * losses[0]


def test_mfu_only_on_tpu():
    assert mfu(1e12, 4e12, "tpu") == 0.25
    assert mfu(1e12, 4e12, "cpu") is None


def test_synthetic_batches_tile_each_global_batch_over_the_ranks_and_a_resume_continues():
    from jobs.train.data import synthetic_batches

    seq_len, vocab, ranks, local = 8, 64, 4, 2
    step2 = [next(iter(synthetic_batches(2, ranks * local, r, local, seq_len, vocab)))["tokens"] for r in range(ranks)]
    assert np.array_equal(np.concatenate(step2), synthetic_tokens(np.arange(16, 24), seq_len, vocab))
    from_zero = synthetic_batches(0, ranks * local, 1, local, seq_len, vocab)
    third = [next(from_zero) for _ in range(3)][2]["tokens"]
    assert np.array_equal(third, step2[1])  # a run resumed at step 2 sees what it would have seen
