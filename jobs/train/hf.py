"""The model in Hugging Face's Llama layout (pure): `LlamaForCausalLM`'s tensor names and
`config.json`, both ways, so what `jobs.train` trains loads in `transformers` and serves with vLLM,
and a pretrained Llama's directory imports (`parse_config` here; the sharded read in `hf_import`).

Our matmuls are `x @ W` with W [in, out]; torch's `nn.Linear` stores [out, in], hence the
transposes. The rotary layout is already Hugging Face's (rotate-half), so q and k need no
permutation. Layers are stacked on axis 0 here and numbered in Hugging Face's names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jobs.train.model import ModelConfig, Params

EMBED, NORM, HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"

# Ours (within a layer) -> Hugging Face's, and whether the matrix is transposed.
LAYER_NAMES = {
    "attn_norm": ("input_layernorm.weight", False),
    "wq": ("self_attn.q_proj.weight", True),
    "wk": ("self_attn.k_proj.weight", True),
    "wv": ("self_attn.v_proj.weight", True),
    "wo": ("self_attn.o_proj.weight", True),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "w_gate": ("mlp.gate_proj.weight", True),
    "w_up": ("mlp.up_proj.weight", True),
    "w_down": ("mlp.down_proj.weight", True),
}


def hf_config(cfg: ModelConfig, torch_dtype: str = "float32") -> dict[str, Any]:
    """`config.json` for `LlamaForCausalLM`."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,  # a tied import trains its head apart from the embedding
        "torch_dtype": torch_dtype,
        **({"rope_scaling": rope_scaling(cfg)} if cfg.rope_factor else {}),
    }


def rope_scaling(cfg: ModelConfig) -> dict[str, Any]:
    """Llama 3's `rope_scaling` entry (the spelling every transformers and vLLM version reads)."""
    return {
        "rope_type": "llama3",
        "factor": cfg.rope_factor,
        "low_freq_factor": cfg.rope_low_freq_factor,
        "high_freq_factor": cfg.rope_high_freq_factor,
        "original_max_position_embeddings": cfg.rope_original_max_positions,
    }


class HFConfigError(ValueError):
    """A config.json this model cannot represent; `key` is the key at fault."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


# What the source's tensors may be stored as (config.json's `dtype`, formerly `torch_dtype`).
SOURCE_DTYPES = ("float32", "bfloat16", "float16")


def parse_config(config: dict[str, Any]) -> tuple[ModelConfig, bool]:
    """A Llama `config.json` -> our ModelConfig (seq_len: its max_position_embeddings) and whether
    the head is tied to the embedding. Both spellings transformers has written are read: 4.x's
    `rope_theta` + `rope_scaling` + `torch_dtype` and 5.x's `rope_parameters` + `dtype`. Raises
    HFConfigError naming the key for what the model cannot represent (pure)."""

    def need(key: str) -> Any:
        if key not in config:
            raise HFConfigError(key, "missing from config.json")
        return config[key]

    arch = config.get("architectures") or ["LlamaForCausalLM"]
    if arch != ["LlamaForCausalLM"] or config.get("model_type", "llama") != "llama":
        raise HFConfigError("architectures", f"{arch} / model_type {config.get('model_type')!r}: only LlamaForCausalLM imports")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise HFConfigError(key, "biases are not in this model (a bias-free Llama only)")
    if config.get("hidden_act", "silu") != "silu":
        raise HFConfigError("hidden_act", f"{config['hidden_act']!r}: this model's MLP is SwiGLU (silu) only")
    d_model, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    if config.get("head_dim") not in (None, d_model // heads) or d_model % heads:
        raise HFConfigError("head_dim", f"{config.get('head_dim')}: this model's head_dim is hidden_size / num_attention_heads")
    dtype_key = "dtype" if "dtype" in config else "torch_dtype"
    if config.get(dtype_key) not in (None, *SOURCE_DTYPES):
        raise HFConfigError(dtype_key, f"{config[dtype_key]!r}: one of {', '.join(SOURCE_DTYPES)} imports")
    rope_key, rope = (
        ("rope_parameters", config["rope_parameters"]) if config.get("rope_parameters") else ("rope_scaling", config.get("rope_scaling"))
    )
    rope = dict(rope or {})
    theta = rope.get("rope_theta", config.get("rope_theta", 10_000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling: dict[str, Any] = {}
    if rope_type == "llama3":
        try:
            scaling = {
                "rope_factor": float(rope["factor"]),
                "rope_low_freq_factor": float(rope["low_freq_factor"]),
                "rope_high_freq_factor": float(rope["high_freq_factor"]),
                "rope_original_max_positions": int(rope["original_max_position_embeddings"]),
            }
        except KeyError as err:
            raise HFConfigError(f"{rope_key}.{err.args[0]}", "missing for rope_type llama3") from None
        if scaling["rope_high_freq_factor"] <= scaling["rope_low_freq_factor"]:
            raise HFConfigError(f"{rope_key}.high_freq_factor", "must be above low_freq_factor")
    elif rope_type != "default":
        raise HFConfigError(f"{rope_key}.rope_type", f"{rope_type!r}: only the default rotary positions and llama3's scaling import")
    try:
        cfg = ModelConfig(
            vocab=int(need("vocab_size")),
            seq_len=int(need("max_position_embeddings")),
            d_model=d_model,
            n_layers=int(need("num_hidden_layers")),
            n_heads=heads,
            n_kv_heads=int(config.get("num_key_value_heads") or heads),
            d_ff=int(need("intermediate_size")),
            rope_theta=float(theta),
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            **scaling,
        )
    except ValueError as err:
        raise HFConfigError("num_key_value_heads" if "n_kv_heads" in str(err) else "head_dim", str(err)) from None
    return cfg, bool(config.get("tie_word_embeddings", False))


def to_hf(params: Params, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Hugging Face's tensor names -> contiguous arrays in `dtype` (for safetensors)."""

    def out(a) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(a), dtype=dtype)

    tensors = {EMBED: out(params["embed"]), NORM: out(params["norm_f"]), HEAD: out(np.asarray(params["lm_head"]).T)}
    for ours, (theirs, transposed) in LAYER_NAMES.items():
        stacked = np.asarray(params["layers"][ours])
        for i, layer in enumerate(stacked):
            tensors[f"model.layers.{i}.{theirs}"] = out(layer.T if transposed else layer)
    return tensors


def from_hf(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> Params:
    """The inverse of `to_hf` (float32)."""

    def get(name: str, transposed: bool) -> np.ndarray:
        a = np.asarray(tensors[name], np.float32)
        return a.T if transposed else a

    layers = {
        ours: np.stack([get(f"model.layers.{i}.{theirs}", transposed) for i in range(cfg.n_layers)])
        for ours, (theirs, transposed) in LAYER_NAMES.items()
    }
    return {
        "embed": get(EMBED, False),
        "layers": layers,
        "norm_f": get(NORM, False),
        "lm_head": get(HEAD, True),
    }
