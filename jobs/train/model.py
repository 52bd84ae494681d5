"""A Llama-architecture decoder in plain JAX, and how to shard it over a (data, fsdp) mesh.

Pre-norm blocks: RMSNorm, grouped-query attention with rotary positions (the rotate-half layout
Hugging Face's `LlamaForCausalLM` uses, so the weights export as they are), a SwiGLU MLP, and an
untied output head: the architecture vLLM and Hugging Face serve. Layers are stacked on a leading
axis and run with `lax.scan`, so compile time does not grow with depth. Parameters are float32,
cast once to `compute_dtype` (bfloat16 on TPU and GPU) before the scan. Attention is the platform's
fused kernel where there is one (jobs.train.attention), what each layer keeps for the backward pass
a named policy (jobs.train.remat), and the loss never holds the logits whole (jobs.train.xent).
Under a mesh (`jax.set_mesh`) the activations are constrained to the batch's sharding, so that XLA
moves the FSDP weights (all-gathers, reduce-scatters), never the activations.

Plain pytrees, not Flax NNX: the parameters are a dict whose leaves map one to one onto the
Hugging Face tensor names (an export is a rename and a transpose), sharding specs are a `tree.map`
over the same dict, and the job needs no framework beyond JAX and optax.

JAX is imported inside the functions that need it: the job's driver uses `ModelConfig` and the
FLOP arithmetic only, and should not pay for importing JAX. The sibling modules it uses need only
JAX and NumPy, and load by path where this file was loaded by path (bench/gpu_mfu.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np


def _sibling(name: str) -> Any:
    """jobs.train.<name>, or the file beside this one when this one was loaded by path."""
    if __package__:
        return importlib.import_module(f"{__package__}.{name}")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        assert spec and spec.loader
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


attention_lib, remat_lib, xent_lib = _sibling("attention"), _sibling("remat"), _sibling("xent")

if TYPE_CHECKING:  # for annotations only: importing JAX costs the driver seconds
    import jax

Params = dict[str, Any]

DATA_AXIS = "data"
FSDP_AXIS = "fsdp"


def batch_spec():
    """The batch is split over every device; parameters over the fsdp axis only (replicated over data)."""
    from jax.sharding import PartitionSpec as P

    return P((DATA_AXIS, FSDP_AXIS), None)


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256
    seq_len: int = 64
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 2
    n_kv_heads: int = 1
    d_ff: int = 384
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    # Llama 3's rotary frequency scaling (`rope_type: llama3` in config.json; 0: none): low
    # frequencies divided by the factor, high ones kept, the band between interpolated.
    rope_factor: float = 0.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 0
    # What each layer keeps for the backward pass (jobs.train.remat.POLICIES; a bool from before
    # the policies had names: true is `full`). Left out of a checkpoint's model comparison.
    remat: str = "none"
    # The attention implementation (jobs.train.attention.IMPLEMENTATIONS). Left out of a
    # checkpoint's model comparison too: neither changes the parameters.
    attention: str = "auto"

    def __post_init__(self):
        if isinstance(self.remat, bool):
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        if self.remat not in remat_lib.POLICIES:
            raise ValueError(f"remat {self.remat!r} is not a policy; valid: {', '.join(remat_lib.POLICIES)}")
        if self.attention not in attention_lib.IMPLEMENTATIONS:
            raise ValueError(f"attention {self.attention!r} is not one of {', '.join(attention_lib.IMPLEMENTATIONS)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"the head dimension d_model / n_heads ({self.head_dim}) must be even for rotary positions")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        """The fields (a checkpoint's meta); the rope scaling ones only when it is on, so a
        checkpoint written before they existed still matches its model."""
        fields = asdict(self)
        if not self.rope_factor:
            for key in ROPE_SCALING_FIELDS:
                del fields[key]
        return fields


ROPE_SCALING_FIELDS = ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_positions")
# How the step computes, not what it computes: a checkpoint's model comparison leaves them out.
COMPUTE_FIELDS = ("remat", "attention")


def same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two `to_dict()`s (a checkpoint's and a run's) are one model, whatever computes it (pure)."""
    return {k: v for k, v in a.items() if k not in COMPUTE_FIELDS} == {k: v for k, v in b.items() if k not in COMPUTE_FIELDS}


# Size presets (`jobs.train --preset NAME`; the shape flags override them). `tiny` trains in seconds
# on 2 CPU cores, with a head dimension of 64 (one vLLM's CPU attention takes); the others are the
# shapes of GPT-3 Small / Llama-3.2-1B / Llama-3-8B (their config.json), for TPU slices. Each one's
# remat policy is the least recompute whose saved tensors fit its slice (REMAT_REFERENCE, checked in
# tests/jobs/train/test_model_pure.py from `remat.saved_bytes_per_token`).
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "125m": ModelConfig(vocab=32_000, seq_len=2048, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, d_ff=2048, remat="minimal"),
    "1b": ModelConfig(
        vocab=128_256, seq_len=2048, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=8192, rope_theta=500_000.0, remat="minimal"
    ),
    "8b": ModelConfig(
        vocab=128_256, seq_len=8192, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14_336, rope_theta=500_000.0, remat="full"
    ),
}
# The slice and sequences per chip each preset's remat default is sized for: (generation, topology, batch per chip).
REMAT_REFERENCE = {"125m": ("v6e", "2x2", 8), "1b": ("v6e", "2x2", 4), "8b": ("v6e", "4x4", 1)}


def with_overrides(preset: ModelConfig, **given: int | str | None) -> ModelConfig:
    """The preset with the shape flags that were given; a new d_model keeps the preset's MLP ratio
    unless d_ff is given too, and new heads keep its grouping where they can (pure)."""
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if "d_model" in changes and "d_ff" not in changes:
        changes["d_ff"] = max(1, round(preset.d_ff * changes["d_model"] / preset.d_model))
    if "n_heads" in changes and "n_kv_heads" not in changes:
        group = preset.n_heads // preset.n_kv_heads
        changes["n_kv_heads"] = changes["n_heads"] // group if changes["n_heads"] % group == 0 else changes["n_heads"]
    return replace(preset, **changes)


def shapes(cfg: ModelConfig) -> Params:
    """Every parameter's shape, in the tree `init_params` builds (pure)."""
    d, f, layers, hd = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    return {
        "embed": (cfg.vocab, d),
        "layers": {
            "attn_norm": (layers, d),
            "wq": (layers, d, q),
            "wk": (layers, d, kv),
            "wv": (layers, d, kv),
            "wo": (layers, q, d),
            "mlp_norm": (layers, d),
            "w_gate": (layers, d, f),
            "w_up": (layers, d, f),
            "w_down": (layers, f, d),
        },
        "norm_f": (d,),
        "lm_head": (d, cfg.vocab),
    }


def param_count(cfg: ModelConfig) -> int:
    """Every parameter (pure; matches `init_params`)."""
    leaves = [*(s for k, s in shapes(cfg).items() if k != "layers"), *shapes(cfg)["layers"].values()]
    return int(sum(np.prod(s) for s in leaves))


def _matmul_params(cfg: ModelConfig) -> int:
    """Parameters that multiply: every layer's projections and the output head; not the embedding,
    which is a lookup (pure)."""
    d, f, layers, hd = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    return layers * (d * q + 2 * d * kv + q * d + 3 * d * f) + d * cfg.vocab


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token at MaxText's count (its maxtext_utils `calculate_tflops_training_per_device`,
    `docs/reference/performance_metrics.md`): 6 x matmul parameters (forward 2, backward 4; the output
    head counts, the embedding lookup does not) + 6 x layers x seq_len x heads x head_dim for the
    attention scores and their use, half of the non-causal 12 since a causal step computes half the
    scores (MaxText PR #1988) (pure)."""
    return 6.0 * _matmul_params(cfg) + 6.0 * cfg.n_layers * cfg.seq_len * cfg.n_heads * cfg.head_dim


def flops_per_token_noncausal(cfg: ModelConfig) -> float:
    """The count before MaxText's: PaLM's, with every attention score counted (12 x layers x seq_len
    x attention width); what the bench printed before, beside the other (pure)."""
    return 6.0 * _matmul_params(cfg) + 12.0 * cfg.n_layers * cfg.seq_len * cfg.n_heads * cfg.head_dim


def init_params(cfg: ModelConfig, seed: int) -> Params:
    """Initial parameters as host numpy arrays (deterministic per seed).

    Numpy, not `jax.random` under `jit`: on a multi-process mesh, compiling a sharded random
    initializer costs several seconds per process, and the small presets are cheap to build on
    each host and hand to `jax.make_array_from_callback`.
    """
    rng = np.random.default_rng(seed)
    tree = shapes(cfg)
    depth = 2 * cfg.n_layers

    def normal(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    layers = tree["layers"]
    d, f, q = cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.head_dim
    return {
        "embed": normal(tree["embed"], 0.02),
        "layers": {
            "attn_norm": np.ones(layers["attn_norm"], np.float32),
            "wq": normal(layers["wq"], 1 / np.sqrt(d)),
            "wk": normal(layers["wk"], 1 / np.sqrt(d)),
            "wv": normal(layers["wv"], 1 / np.sqrt(d)),
            "wo": normal(layers["wo"], 1 / np.sqrt(q * depth)),
            "mlp_norm": np.ones(layers["mlp_norm"], np.float32),
            "w_gate": normal(layers["w_gate"], 1 / np.sqrt(d)),
            "w_up": normal(layers["w_up"], 1 / np.sqrt(d)),
            "w_down": normal(layers["w_down"], 1 / np.sqrt(f * depth)),
        },
        "norm_f": np.ones(tree["norm_f"], np.float32),
        "lm_head": normal(tree["lm_head"], 0.02),  # Hugging Face Llama's initializer_range: logits start near uniform
    }


def rms_norm(x, scale, eps: float):
    import jax
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype) * scale


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
    """The rotary inverse frequencies [head_dim / 2] (float32), with Llama 3's scaling when the
    config has it: transformers' `_compute_llama3_parameters`, step for step and in float32 as it
    computes them, so that the logits agree to float32 rounding (pure)."""
    hd = cfg.head_dim
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))).astype(np.float32)
    if not cfg.rope_factor:
        return inv_freq
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old_context = cfg.rope_original_max_positions
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(seq: int, head_dim: int, theta: float, inv_freq: np.ndarray | None = None):
    """cos and sin [seq, head_dim] for rotary positions, in Hugging Face Llama's layout (pure);
    `inv_freq` (`inv_frequencies`) overrides the unscaled frequencies of `theta`."""
    import jax.numpy as jnp

    if inv_freq is None:
        inv_freq = inv_frequencies(ModelConfig(d_model=head_dim, n_heads=1, n_kv_heads=1, rope_theta=theta))
    angles = jnp.outer(jnp.arange(seq, dtype=jnp.float32), jnp.asarray(inv_freq))
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """x [batch, seq, heads, head_dim] rotated by position: x cos + rotate_half(x) sin."""
    import jax.numpy as jnp

    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x.astype(jnp.float32) * cos[:, None, :] + rotated.astype(jnp.float32) * sin[:, None, :]).astype(x.dtype)


def constrain(x: Any, *spec: Any) -> Any:
    """`x` constrained to PartitionSpec(*spec) under a (data, fsdp) mesh (`jax.set_mesh`); as it is
    with none, so the step traces without a mesh too."""
    import jax
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not {DATA_AXIS, FSDP_AXIS} <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, P(*spec))


def layer_fn(cfg: ModelConfig, seq: int) -> Any:
    """One decoder layer, (x [batch, seq, d_model], layer weights) -> (x, None), as `lax.scan` runs
    it; its projections named for the remat policies (MaxText's names)."""
    import jax
    from jax.ad_checkpoint import checkpoint_name

    hd, heads, kv_heads = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    rows = (DATA_AXIS, FSDP_AXIS)
    cos, sin = rope_tables(seq, hd, cfg.rope_theta, inv_frequencies(cfg))

    def block(x, layer):
        batch = x.shape[0]
        h = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        q = checkpoint_name(h @ layer["wq"], "query_proj").reshape(batch, seq, heads, hd)
        k = checkpoint_name(h @ layer["wk"], "key_proj").reshape(batch, seq, kv_heads, hd)
        v = checkpoint_name(h @ layer["wv"], "value_proj").reshape(batch, seq, kv_heads, hd)
        attn = attention_lib.attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, cfg.attention)
        x = constrain(x + checkpoint_name(attn.reshape(batch, seq, heads * hd) @ layer["wo"], "out_proj"), rows, None, None)
        h = rms_norm(x, layer["mlp_norm"], cfg.norm_eps)
        gate, up = checkpoint_name(h @ layer["w_gate"], "mlpwi_0"), checkpoint_name(h @ layer["w_up"], "mlpwi_1")
        x = constrain(x + checkpoint_name((jax.nn.silu(gate) * up) @ layer["w_down"], "mlpwo"), rows, None, None)
        return x, None

    return remat_lib.wrap(block, cfg.remat)


def hidden_states(params: Params, tokens: jax.Array, cfg: ModelConfig, compute_dtype=None) -> jax.Array:
    """The final norm's output [batch, seq, d_model] in `compute_dtype` (default float32)."""
    import jax
    import jax.numpy as jnp

    compute_dtype = compute_dtype or jnp.float32
    x = constrain(params["embed"][tokens].astype(compute_dtype), (DATA_AXIS, FSDP_AXIS), None, None)
    layers = jax.tree.map(lambda w: w.astype(compute_dtype), params["layers"])  # once, not per layer under remat
    x, _ = jax.lax.scan(layer_fn(cfg, tokens.shape[1]), x, layers)
    return rms_norm(x, params["norm_f"].astype(compute_dtype), cfg.norm_eps)


def forward(params: Params, tokens: jax.Array, cfg: ModelConfig, compute_dtype=None) -> jax.Array:
    """Logits [batch, seq, vocab] (float32) for int tokens [batch, seq]; matmuls in `compute_dtype`
    (default float32). The training loss never builds them (`loss_fn`)."""
    import jax.numpy as jnp

    x = hidden_states(params, tokens, cfg, compute_dtype)
    return (x @ params["lm_head"].astype(x.dtype)).astype(jnp.float32)


def make_schedule(learning_rate: float, warmup_steps: int, total_steps: int):
    """The learning rate by step: linear warmup from 0, then cosine decay."""
    import optax

    return optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(1, warmup_steps), max(total_steps, warmup_steps + 1))


def make_optimizer(learning_rate: float, warmup_steps: int, total_steps: int):
    """AdamW (weight decay 0.01) with global-norm clipping at 1 and a warmup-cosine schedule."""
    import optax

    schedule = make_schedule(learning_rate, warmup_steps, total_steps)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def train_step_with_metrics(optimizer, cfg: ModelConfig, compute_dtype=None, accum: int = 1):
    """The step every worker compiles: (params, opt_state, tokens [batch, seq_len + 1]) ->
    (params, opt_state, {loss, grad_norm}) (the gradients' global norm, before clipping), the
    batch taken as `accum` micro-batches (jobs.train.accumulate). Sharding is the caller's."""
    import optax

    from jobs.train import accumulate

    value_and_grad = accumulate.value_and_grad(loss_fn, accum)

    def step(params, opt_state, tokens):
        loss, grads = value_and_grad(params, tokens, cfg, compute_dtype)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads)}

    return step


def train_step(optimizer, cfg: ModelConfig, compute_dtype=None):
    """`train_step_with_metrics` returning the loss alone: (params, opt_state, tokens) -> (params, opt_state, loss)."""
    with_metrics = train_step_with_metrics(optimizer, cfg, compute_dtype)

    def step(params, opt_state, tokens):
        params, opt_state, metrics = with_metrics(params, opt_state, tokens)
        return params, opt_state, metrics["loss"]

    return step


def greedy(params: Params, prompt: list[int], cfg: ModelConfig, new_tokens: int) -> list[int]:
    """The `new_tokens` tokens a greedy decode appends to `prompt` (float32, the whole prefix
    recomputed per token: a reference for checking a serving engine, not a fast decoder)."""
    import jax.numpy as jnp

    tokens = list(prompt)
    for _ in range(new_tokens):
        logits = forward(params, jnp.asarray([tokens], jnp.int32), cfg)
        tokens.append(int(jnp.argmax(logits[0, -1])))
    return tokens[len(prompt) :]


def loss_fn(params: Params, tokens: jax.Array, cfg: ModelConfig, compute_dtype=None) -> jax.Array:
    """Mean next-token cross-entropy; `tokens` is [batch, seq_len + 1]. Chunked over the tokens
    (jobs.train.xent), so the logits [tokens, vocab] never exist whole."""
    x = hidden_states(params, tokens[:, :-1], cfg, compute_dtype)
    batch, seq, d = x.shape
    hidden = constrain(x.reshape(batch * seq, d), (DATA_AXIS, FSDP_AXIS), None)
    head = constrain(params["lm_head"].astype(x.dtype))  # gathered once, not in every chunk of the scan
    return xent_lib.cross_entropy(hidden, head, tokens[:, 1:].reshape(-1))


def fsdp_spec(shape: tuple[int, ...], fsdp: int, stacked: bool):
    """Shard the largest dimension that `fsdp` divides (never the stacked layer axis); replicate
    what is too small to split."""
    from jax.sharding import PartitionSpec as P

    dims = list(range(1 if stacked else 0, len(shape)))
    for dim in sorted(dims, key=lambda i: -shape[i]):
        if fsdp > 1 and shape[dim] % fsdp == 0:
            spec: list[str | None] = [None] * len(shape)
            spec[dim] = FSDP_AXIS
            return P(*spec)
    return P()


def param_specs(params: Params, fsdp: int) -> Any:
    """A PartitionSpec per parameter (same tree), for `NamedSharding` over a (data, fsdp) mesh."""
    specs = {name: fsdp_spec(w.shape, fsdp, stacked=False) for name, w in params.items() if name != "layers"}
    specs["layers"] = {name: fsdp_spec(w.shape, fsdp, stacked=True) for name, w in params["layers"].items()}
    return specs
