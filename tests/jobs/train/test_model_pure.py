"""The Llama-architecture model on one CPU device (real JAX): causality, rotary positions, grouped-
query attention, the presets and their overrides, and the 8B preset's per-chip memory on a v6e 4x4."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from infra import catalog
from jobs.train.model import (
    PRESETS,
    ModelConfig,
    apply_rope,
    forward,
    init_params,
    param_count,
    param_specs,
    rope_tables,
    shapes,
    with_overrides,
)

CFG = ModelConfig(vocab=64, seq_len=16, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96)


def logits(params, tokens, cfg=CFG):
    return np.asarray(forward(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens), cfg))


def test_a_position_sees_only_the_tokens_before_it():
    params = init_params(CFG, 0)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, (2, CFG.seq_len))
    changed = tokens.copy()
    changed[:, 10:] = (changed[:, 10:] + 1) % CFG.vocab
    a, b = logits(params, tokens), logits(params, changed)
    np.testing.assert_allclose(a[:, :10], b[:, :10], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[:, 10:], b[:, 10:])


def test_rotary_scores_depend_only_on_the_distance_between_positions():
    cos, sin = rope_tables(32, 8, 10_000.0)
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((1, 1, 1, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 1, 1, 8)), jnp.float32)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q, cos[m : m + 1], sin[m : m + 1])
        kn = apply_rope(k, cos[n : n + 1], sin[n : n + 1])
        return float(jnp.sum(qm * kn))

    assert score(5, 2) == pytest.approx(score(20, 17), rel=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)
    assert score(0, 0) == pytest.approx(float(jnp.sum(q * k)), rel=1e-6)  # position 0 is not rotated


def test_grouped_query_attention_is_attention_with_each_kv_head_shared_by_its_group():
    # The same model with the key/value heads repeated for every query head (plain multi-head
    # attention) computes the same logits: GQA only shares them.
    params = init_params(CFG, 2)
    group = CFG.n_heads // CFG.n_kv_heads
    mha = dataclasses.replace(CFG, n_kv_heads=CFG.n_heads)
    repeated = {**params, "layers": dict(params["layers"])}
    for name in ("wk", "wv"):
        w = params["layers"][name].reshape(CFG.n_layers, CFG.d_model, CFG.n_kv_heads, CFG.head_dim)
        repeated["layers"][name] = np.repeat(w, group, axis=2).reshape(CFG.n_layers, CFG.d_model, -1)
    tokens = np.random.default_rng(3).integers(0, CFG.vocab, (2, CFG.seq_len))
    np.testing.assert_allclose(logits(params, tokens), logits(repeated, tokens, mha), rtol=1e-5, atol=1e-5)


def test_param_count_matches_the_parameters_and_the_presets_are_their_models():
    params = init_params(CFG, 0)
    assert param_count(CFG) == sum(x.size for x in jax.tree.leaves(params))
    assert jax.tree.map(lambda a: a.shape, params) == shapes(CFG)
    counts = {name: param_count(cfg) for name, cfg in PRESETS.items()}
    assert counts["8b"] == 8_030_261_248  # Llama-3-8B's own count
    assert 120e6 < counts["125m"] < 140e6 and 1.2e9 < counts["1b"] < 1.6e9 and counts["tiny"] < 1e6
    assert PRESETS["tiny"].head_dim == 64  # a head size vLLM's CPU attention takes
    assert all(cfg.n_heads % cfg.n_kv_heads == 0 for cfg in PRESETS.values())


def test_shape_flags_override_a_preset():
    base = PRESETS["125m"]
    assert with_overrides(base) == base
    wider = with_overrides(base, d_model=1536)
    assert wider.d_model == 1536 and wider.d_ff == 2 * base.d_ff  # the preset's MLP ratio is kept
    assert with_overrides(base, d_model=1536, d_ff=100).d_ff == 100
    gqa = with_overrides(PRESETS["8b"], n_heads=16)
    assert (gqa.n_heads, gqa.n_kv_heads) == (16, 4)  # the preset's 4 query heads per kv head
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        with_overrides(base, n_kv_heads=5)


def per_chip_bytes(cfg: ModelConfig, chips: int) -> dict[str, float]:
    """Bytes per chip of the training state with every parameter and its optimizer state fully
    sharded over `chips` (the slice's fsdp axis), from shapes alone (jax.eval_shape)."""
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4, weight_decay=0.01))
    opt_state = jax.eval_shape(optimizer.init, abstract)
    specs = param_specs(abstract, chips)

    def sharded(leaf, spec) -> float:
        size = np.prod(leaf.shape) * leaf.dtype.itemsize
        return size / chips if any(axis is not None for axis in spec) else size

    params = sum(jax.tree.leaves(jax.tree.map(sharded, abstract, specs)))
    moments = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(opt_state)) / chips
    # With remat, the backward pass keeps one residual stream per layer ([seq, d_model], bf16) for
    # one sequence per chip, plus one layer's activations, recomputed.
    residuals = cfg.n_layers * cfg.seq_len * cfg.d_model * 2
    one_layer = cfg.seq_len * (10 * cfg.d_model + 3 * cfg.d_ff) * 2 + cfg.n_heads * cfg.seq_len**2 * 4
    return {"params": params, "grads": params, "optimizer": moments, "activations": residuals + one_layer}


def test_the_8b_preset_fits_a_v6e_4x4_per_chip(capsys):
    shape = catalog.shape("v6e", "4x4")
    cfg = PRESETS["8b"]
    need = per_chip_bytes(cfg, shape.chips)
    hbm = shape.hbm_bytes / shape.chips
    with capsys.disabled():
        parts = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in need.items())
        print(
            f"\n8b preset on {shape} ({param_count(cfg) / 1e9:.2f}B params): per chip {parts}; total {sum(need.values()) / 2**30:.1f} of {hbm / 2**30:.0f} GiB HBM"
        )
    assert cfg.remat
    assert need["params"] == pytest.approx(param_count(cfg) * 4 / shape.chips, rel=0.01)  # every matrix sharded 16 ways
    assert sum(need.values()) < 0.8 * hbm
    # And the same state could not be held by one v6e host without sharding over hosts.
    assert need["params"] * shape.chips * 4 > shape.hbm_bytes / shape.hosts


REMAT_ORDER = ("none", "minimal", "save_dots", "full")  # least recompute first
REMAT_SHARE = 0.4  # of a chip's HBM for the state and the saved tensors: the rest for XLA's working set


def remat_estimate(cfg: ModelConfig, policy: str, chips: int, batch_per_chip: int) -> float:
    """Per-chip bytes: parameters, gradients and Adam's two moments (float32, fully sharded), and
    the tensors `policy` keeps for `batch_per_chip` sequences (jobs.train.remat.saved_bytes_per_token)."""
    from jobs.train import remat

    per_token = remat.saved_bytes_per_token(
        policy,
        d_model=cfg.d_model,
        q_width=cfg.n_heads * cfg.head_dim,
        kv_width=cfg.n_kv_heads * cfg.head_dim,
        d_ff=cfg.d_ff,
        heads=cfg.n_heads,
        seq=cfg.seq_len,
    )
    return param_count(cfg) * 4 * 4 / chips + per_token * cfg.seq_len * batch_per_chip * cfg.n_layers


def test_each_presets_remat_default_is_the_least_recompute_that_fits_its_slice(capsys):
    from jobs.train.model import REMAT_REFERENCE

    for name, (generation, topology, batch_per_chip) in REMAT_REFERENCE.items():
        cfg, shape = PRESETS[name], catalog.shape(generation, topology)
        budget = REMAT_SHARE * shape.hbm_bytes / shape.chips
        fits = [p for p in REMAT_ORDER if remat_estimate(cfg, p, shape.chips, batch_per_chip) <= budget]
        with capsys.disabled():
            estimates = ", ".join(f"{p} {remat_estimate(cfg, p, shape.chips, batch_per_chip) / 2**30:.1f}" for p in REMAT_ORDER)
            print(f"\n{name} on {generation} {topology}, {batch_per_chip} sequence(s) per chip: {estimates} GiB of {budget / 2**30:.0f}")
        assert fits and cfg.remat == fits[0], (name, cfg.remat, fits)
    assert PRESETS["tiny"].remat == "none"  # trains on 2 CPU cores: nothing to save
