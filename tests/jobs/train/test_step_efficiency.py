"""The step's efficiency work, checked on CPU with real JAX (jobs/train/attention.py, remat.py,
xent.py and model.py): every attention implementation this machine can run gives today's logits
and gradients (and a non-causal one does not); each remat policy keeps what it names and changes no
gradient; the chunked loss is optax's; under an 8-device (data, fsdp) mesh the step's collectives
move weights, never activations; the checkpoint comparison ignores how the step computes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax._src.ad_checkpoint import saved_residuals

from jobs import REPO_ROOT
from jobs.train import attention, remat, xent
from jobs.train.model import PRESETS, ModelConfig, forward, init_params, layer_fn, loss_fn, same_model, with_overrides

# The tiny preset (grouped: 2 query heads per key/value head) at a sequence splash tiles, and one
# with 4 query heads over 2 key/value heads.
MODELS = {
    "tiny": with_overrides(PRESETS["tiny"], seq_len=128),
    "gqa-4-2": with_overrides(PRESETS["tiny"], seq_len=128, n_heads=4, n_kv_heads=2, d_model=256),
}
ON_CPU = ("xla", "splash", "auto")  # cuDNN needs a GPU
TOLERANCE = 2e-5  # float32 on CPU: the implementations sum in different orders


def reference(q, k, v, causal: bool = True):
    """JAX's own attention (XLA), independent of ours."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")


def logits_and_grads(cfg: ModelConfig, tokens):
    params = jax.tree.map(jnp.asarray, init_params(cfg, 0))
    logits = forward(params, tokens[:, :-1], cfg)
    grads = jax.grad(loss_fn)(params, tokens, cfg)
    return logits, grads


def max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.slow  # splash in Pallas' interpret mode, through a whole model's backward pass: ~20 s
def test_every_attention_available_here_gives_the_tiny_models_logits_and_gradients():
    cfg = MODELS["tiny"]
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab, (2, cfg.seq_len + 1)), jnp.int32)
    want_logits, want_grads = logits_and_grads(replace(cfg, attention="xla"), tokens)
    for implementation in ON_CPU:
        logits, grads = logits_and_grads(replace(cfg, attention=implementation), tokens)
        assert max_diff(logits, want_logits) < TOLERANCE, implementation
        assert max_diff(grads, want_grads) < TOLERANCE, implementation


@pytest.mark.parametrize("name", [pytest.param("tiny"), pytest.param("gqa-4-2", marks=pytest.mark.slow)])
def test_every_attention_available_here_is_causal_attention_in_value_and_gradient(name):
    """Each against JAX's own attention (XLA), forward and backward; a mask bug (non-causal) is
    caught by the same tolerance."""
    cfg = MODELS[name]
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.standard_normal((1, cfg.seq_len, cfg.n_heads, cfg.head_dim)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((1, cfg.seq_len, cfg.n_kv_heads, cfg.head_dim)), jnp.float32) for _ in range(2))

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) ** 2)

    want_grads = jax.grad(loss(reference), (0, 1, 2))(q, k, v)
    for implementation in ON_CPU:

        def ours(q, k, v, implementation=implementation):
            return attention.attend(q, k, v, implementation)

        out = ours(q, k, v)
        assert float(jnp.max(jnp.abs(out - reference(q, k, v)))) < TOLERANCE, implementation
        assert float(jnp.max(jnp.abs(out - reference(q, k, v, causal=False)))) > 100 * TOLERANCE, implementation
        assert max_diff(jax.grad(loss(ours), (0, 1, 2))(q, k, v), want_grads) < 20 * TOLERANCE, implementation


def test_auto_is_splash_in_a_step_exported_for_tpu_and_never_the_materialized_scores():
    q = jax.ShapeDtypeStruct((1, 1024, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1024, 2, 64), jnp.bfloat16)
    exported = jax.export.export(jax.jit(lambda q, k, v: attention.attend(q, k, v, "auto")), platforms=["tpu"])(q, kv, kv)
    text = exported.mlir_module()
    assert "tpu_custom_call" in text and "splash" in text.lower()  # the Pallas kernel, lowered for TPU
    assert "1024x1024" not in text  # nor, in the default branch beside it, the [seq, seq] scores
    on_cpu = jax.jit(lambda q, k, v: attention.attend(q, k, v, "auto")).lower(q, kv, kv).as_text()
    assert "tpu_custom_call" not in on_cpu
    assert attention.block_size(2048) == 512 and attention.block_size(128) == 128 and attention.block_size(64) is None


def test_each_remat_policy_keeps_what_it_names_and_no_gradient_changes():
    cfg = replace(PRESETS["tiny"], attention="xla")
    params = jax.tree.map(jnp.asarray, init_params(cfg, 0))
    layer = jax.tree.map(lambda w: w[0], params["layers"])
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, cfg.seq_len, cfg.d_model)), jnp.float32)
    kept, counts = {}, {}
    for policy in ("none", "minimal", "save_dots", "full"):
        block = layer_fn(replace(cfg, remat=policy), cfg.seq_len)
        residuals = [where for _, where in saved_residuals(lambda x, layer, block=block: block(x, layer)[0].sum(), x, layer)]
        kept[policy] = {where.split("'")[1] for where in residuals if where.startswith("named ")}
        counts[policy] = len(residuals)
        if policy == "none":
            assert any("xla_attention" in where for where in residuals)  # everything, the attention's internals too
    assert counts["none"] > counts["minimal"] > counts["save_dots"] > counts["full"]
    assert kept["full"] == set()
    assert kept["save_dots"] == set(remat.ATTENTION_DOTS)
    # `mlpwo`'s output is named too, but the backward pass needs it in no layer: only the others are kept.
    assert kept["minimal"] == set(remat.SAVED["minimal"]) - {"mlpwo"}
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, cfg.vocab, (2, cfg.seq_len + 1)), jnp.int32)
    grads = {p: jax.grad(loss_fn)(params, tokens, replace(cfg, remat=p)) for p in ("none", "full")}  # the two ends
    assert max_diff(grads["full"], grads["none"]) < 1e-6
    sizes = dict(d_model=4096, q_width=4096, kv_width=1024, d_ff=14336, heads=32, seq=8192)
    by_policy = [remat.saved_bytes_per_token(p, **sizes) for p in ("none", "minimal", "save_dots", "full")]
    assert by_policy == sorted(by_policy, reverse=True)  # each keeps less than the one before


@pytest.mark.parametrize(("tokens", "chunk"), [(37, 8), (10, 100)])  # a last chunk padded; one chunk bigger than the tokens
def test_the_chunked_loss_is_optaxs_in_value_and_gradient(tokens, chunk):
    rng = np.random.default_rng(tokens)
    hidden = jnp.asarray(rng.standard_normal((tokens, 16)), jnp.float32)
    head = jnp.asarray(rng.standard_normal((16, 50)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 50, tokens))

    def optax_loss(h, w):
        return optax.softmax_cross_entropy_with_integer_labels(h @ w, labels).mean()

    def ours(h, w):
        return xent.cross_entropy(h, w, labels, chunk=chunk)

    assert abs(float(ours(hidden, head)) - float(optax_loss(hidden, head))) < 1e-6
    assert max_diff(jax.grad(ours, (0, 1))(hidden, head), jax.grad(optax_loss, (0, 1))(hidden, head)) < 1e-6


def test_the_models_loss_is_optaxs_on_its_own_logits():
    cfg = PRESETS["tiny"]
    params = jax.tree.map(jnp.asarray, init_params(cfg, 0))
    batch = jnp.asarray(np.random.default_rng(5).integers(0, cfg.vocab, (2, cfg.seq_len + 1)), jnp.int32)
    want = optax.softmax_cross_entropy_with_integer_labels(forward(params, batch[:, :-1], cfg), batch[:, 1:]).mean()
    assert abs(float(loss_fn(params, batch, cfg)) - float(want)) < 1e-5


def test_auto_runs_blockwise_attention_off_accelerators_where_the_sequence_tiles():
    """At 1024 tokens `auto` on this CPU is the online-softmax loop over 512-token key blocks: the same
    attention, forward and backward, without the [seq, seq] scores."""
    rng = np.random.default_rng(6)
    q = jnp.asarray(rng.standard_normal((1, 1024, 2, 32)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((1, 1024, 1, 32)), jnp.float32) for _ in range(2))
    assert float(jnp.max(jnp.abs(attention.attend(q, k, v, "auto") - reference(q, k, v)))) < TOLERANCE
    grads = jax.grad(lambda *a: jnp.sum(attention.attend(*a, "auto") ** 2), (0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(reference(*a) ** 2), (0, 1, 2))(q, k, v)
    assert max_diff(grads, want) < 20 * TOLERANCE
    text = jax.jit(lambda *a: attention.attend(*a, "auto")).lower(q, k, v).as_text()
    assert "1024x1024" not in text  # no [.., seq, seq] tensor: 512-key blocks


COLLECTIVES = textwrap.dedent(
    """
    import json, os, re, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np, optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jobs.train.model import (DATA_AXIS, FSDP_AXIS, ModelConfig, batch_spec, make_optimizer, param_specs, shapes, train_step)
    # Distinct sizes: the sequence (128) is no weight's dimension, so an activation shows by it.
    cfg = ModelConfig(vocab=320, seq_len=128, d_model=96, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=160)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), (DATA_AXIS, FSDP_AXIS))
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, np.float32), shapes(cfg), is_leaf=lambda s: isinstance(s, tuple))
    params = jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(abstract, 4))
    opt = make_optimizer(1e-3, 5, 10)
    replicated = NamedSharding(mesh, P())
    opt_sh = optax.tree_map_params(opt, lambda _, s: s, jax.eval_shape(opt.init, abstract), params, transform_non_params=lambda _: replicated)
    batch = NamedSharding(mesh, batch_spec())
    step = jax.jit(train_step(opt, cfg), in_shardings=(params, opt_sh, batch), out_shardings=(params, opt_sh, replicated))
    a = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, params)
    o = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), jax.eval_shape(opt.init, abstract), opt_sh)
    tokens = jax.ShapeDtypeStruct((16, cfg.seq_len + 1), np.int32, sharding=batch)
    out = {}
    for name, context in (("mesh", jax.set_mesh(mesh)), ("none", None)):
        if context is not None:
            with context:
                hlo = step.lower(a, o, tokens).compile().as_text()
        else:
            hlo = step.lower(a, o, tokens).compile().as_text()
        lines = [l for l in hlo.splitlines() if re.search(r" (all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)(-start)?\\(", l)]
        kinds = [re.search(r" (all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)", l).group(1) for l in lines]
        shapes_ = [tuple(int(d) for d in dims.split(",") if d) for l in lines for dims in re.findall(r"[fs]\\d+\\[([0-9,]*)\\]", l.split(" = ", 1)[1].split("(", 1)[0] if " = " in l else l)]
        out[name] = {"kinds": kinds, "shapes": shapes_}
    print("COLLECTIVES " + json.dumps(out))
    """
)


def test_under_a_mesh_the_steps_collectives_move_weights_never_activations():
    proc = subprocess.run([sys.executable, "-c", COLLECTIVES], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("COLLECTIVES "))[12:])
    mesh, none = found["mesh"], found["none"]
    assert "all-gather" in mesh["kinds"] and not {"all-to-all", "collective-permute"} & set(mesh["kinds"])
    # FSDP's: weights gathered, gradients reduced; no tensor with the sequence's 128 (an activation).
    assert mesh["shapes"] and not [s for s in mesh["shapes"] if 128 in s], mesh
    # Without the constraints (no mesh set), XLA's own propagation moves activations.
    assert [s for s in none["shapes"] if 128 in s], none


def test_a_checkpoints_model_is_the_same_whatever_computes_it():
    cfg = PRESETS["1b"]
    assert same_model(cfg.to_dict(), replace(cfg, attention="xla", remat="full").to_dict())
    old = {**cfg.to_dict(), "remat": True}  # a checkpoint's meta from before the policies had names
    old.pop("attention")
    assert same_model(old, cfg.to_dict())
    assert not same_model(cfg.to_dict(), replace(cfg, n_layers=2).to_dict())
    assert ModelConfig(remat=True).remat == "full" and ModelConfig(remat=False).remat == "none"
    with pytest.raises(ValueError, match="is not a policy"):
        ModelConfig(remat="some")
