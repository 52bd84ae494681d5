"""The model in Hugging Face's Llama layout (pure): `LlamaForCausalLM`'s tensor names and
`config.json`, so what `jobs.train` trains loads in `transformers` and serves with vLLM.

Our matmuls are `x @ W` with W [in, out]; torch's `nn.Linear` stores [out, in], hence the
transposes. The rotary layout is already Hugging Face's (rotate-half), so q and k need no
permutation. Layers are stacked on axis 0 here and numbered in Hugging Face's names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jobs.train.model import ModelConfig, Params

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
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
    }


def to_hf(params: Params, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Hugging Face's tensor names -> contiguous arrays in `dtype` (for safetensors)."""

    def out(a) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(a), dtype=dtype)

    tensors = {
        "model.embed_tokens.weight": out(params["embed"]),
        "model.norm.weight": out(params["norm_f"]),
        "lm_head.weight": out(np.asarray(params["lm_head"]).T),
    }
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
        "embed": get("model.embed_tokens.weight", False),
        "layers": layers,
        "norm_f": get("model.norm.weight", False),
        "lm_head": get("lm_head.weight", True),
    }
