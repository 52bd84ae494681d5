"""A small decoder-only transformer LM in plain JAX, and how to shard it (data + FSDP).

Pre-norm blocks (RMSNorm, causal multi-head attention, GELU MLP), learned positions, output tied to
the embedding. Layers are stacked on a leading axis and run with `lax.scan`, so compile time does
not grow with depth. Parameters are float32; matmuls run in `compute_dtype` (bfloat16 on TPU).

JAX is imported inside the functions that need it: the job's driver uses `ModelConfig` and the
FLOP arithmetic only, and should not pay for importing JAX.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

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
    n_heads: int = 4
    d_ff: int = 512

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def param_count(cfg: ModelConfig) -> int:
    """Every parameter (pure; matches `init_params`)."""
    d, f, layers = cfg.d_model, cfg.d_ff, cfg.n_layers
    per_layer = 2 * d + d * 3 * d + d * d + d * f + f * d
    return cfg.vocab * d + cfg.seq_len * d + layers * per_layer + d


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token, the PaLM way: 6 x matmul parameters (forward 2, backward 4; the
    tied output projection counts, the embedding lookup does not) + 12 x layers x d_model x seq_len
    for the attention scores and their use."""
    d, f, layers = cfg.d_model, cfg.d_ff, cfg.n_layers
    matmul_params = layers * (d * 3 * d + d * d + 2 * d * f) + d * cfg.vocab
    return 6.0 * matmul_params + 12.0 * layers * d * cfg.seq_len


def init_params(cfg: ModelConfig, seed: int) -> Params:
    """Initial parameters as host numpy arrays (deterministic per seed).

    Numpy, not `jax.random` under `jit`: on a multi-process mesh, compiling a sharded random
    initializer costs several seconds per process, and the arrays are small enough to build on
    each host and hand to `jax.make_array_from_callback`.
    """
    rng = np.random.default_rng(seed)
    d, f, layers = cfg.d_model, cfg.d_ff, cfg.n_layers

    def normal(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "embed": normal((cfg.vocab, d), 0.02),
        "pos": normal((cfg.seq_len, d), 0.02),
        "layers": {
            "norm1": np.ones((layers, d), np.float32),
            "wqkv": normal((layers, d, 3 * d), 1 / np.sqrt(d)),
            "wo": normal((layers, d, d), 1 / np.sqrt(d * 2 * layers)),
            "norm2": np.ones((layers, d), np.float32),
            "w1": normal((layers, d, f), 1 / np.sqrt(d)),
            "w2": normal((layers, f, d), 1 / np.sqrt(f * 2 * layers)),
        },
        "norm_f": np.ones((d,), np.float32),
    }


def _rms_norm(x, scale):
    import jax
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6) * scale).astype(x.dtype)


def forward(params: Params, tokens: jax.Array, cfg: ModelConfig, compute_dtype=None) -> jax.Array:
    """Logits [batch, seq, vocab] (float32) for int tokens [batch, seq]; matmuls in `compute_dtype`
    (default float32)."""
    import jax
    import jax.numpy as jnp

    compute_dtype = compute_dtype or jnp.float32
    batch, seq = tokens.shape
    x = (params["embed"][tokens] + params["pos"][:seq]).astype(compute_dtype)
    causal = jnp.tril(jnp.ones((seq, seq), bool))

    def block(x, layer):
        layer = jax.tree.map(lambda w: w.astype(compute_dtype), layer)
        h = _rms_norm(x, layer["norm1"])
        q, k, v = jnp.split(h @ layer["wqkv"], 3, axis=-1)
        q, k, v = (t.reshape(batch, seq, cfg.n_heads, cfg.head_dim) for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(cfg.head_dim)
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1).astype(compute_dtype)
        attn = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, cfg.d_model)
        x = x + attn @ layer["wo"]
        h = _rms_norm(x, layer["norm2"])
        x = x + jax.nn.gelu(h @ layer["w1"]) @ layer["w2"]
        return x, None

    x, _ = jax.lax.scan(block, x, params["layers"])
    x = _rms_norm(x, params["norm_f"].astype(compute_dtype))
    return (x @ params["embed"].astype(compute_dtype).T).astype(jnp.float32)


def loss_fn(params: Params, tokens: jax.Array, cfg: ModelConfig, compute_dtype=None) -> jax.Array:
    """Mean next-token cross-entropy; `tokens` is [batch, seq_len + 1]."""
    import optax

    logits = forward(params, tokens[:, :-1], cfg, compute_dtype)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


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
