"""A tiny random Llama in Hugging Face format, with a tokenizer trained here: the model that
`make serve-demo`, the serving end-to-end test and `make bench` serve with the real vLLM engine.

  python -m jobs.serve.tiny_model OUT_DIR [--seed 0]

Nothing is downloaded: the weights are seeded random numbers (numpy) written as safetensors, and the
tokenizer is a byte-level BPE trained on a paragraph that ships in this file, so the same seed gives
the same bytes on every machine. It needs `tokenizers`, `safetensors` and `transformers` (the serving
env, `.venv-serve`), not torch.

The shapes are what vLLM's CPU backend accepts (head_dim 64, which its attention kernels support)
and small enough that an engine starts in well under a minute on 2 cores. `write_hf_llama` takes any
Llama-shaped weights, so a trained checkpoint can be exported the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from jobs.runtime.hf_tokenizer import BOS, EOS, tokenizer_files, train_byte_bpe

# The files a Hugging Face model directory needs for vLLM: the engine reads config.json and the
# safetensors; the OpenAI server reads the tokenizer and its chat template.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)

# What the tokenizer learns its merges from. Any text works: the model is random, so only the
# vocabulary's coverage matters (byte-level BPE encodes any string, whatever it learned).
CORPUS = """\
Ray Serve LLM runs vLLM engines as Serve deployments behind an OpenAI compatible router.
A TPU slice is a set of chips joined by the inter-chip interconnect; a multi-host slice spans several
virtual machines, one Kubernetes pod each, and a replica reserves the whole slice at once.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris.
Count with me: one, two, three, four, five, six, seven, eight, nine, ten, 0 1 2 3 4 5 6 7 8 9.
The model reads tokens, predicts the next token, and the server streams the tokens back to the client.
"""


@dataclass(frozen=True)
class TinyLlamaConfig:
    """The architecture. head_dim = hidden_size / num_attention_heads = 64."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# vLLM's CPU attention supports these head sizes (vllm/v1/attention/backends/cpu_attn.py).
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def random_weights(cfg: TinyLlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Llama weights under Hugging Face's names (LlamaForCausalLM), float32, N(0, 0.02)."""
    rng = np.random.default_rng(seed)
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(cfg.vocab_size, h)}
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        weights[p + "self_attn.q_proj.weight"] = normal(cfg.num_attention_heads * hd, h)
        weights[p + "self_attn.k_proj.weight"] = normal(cfg.num_key_value_heads * hd, h)
        weights[p + "self_attn.v_proj.weight"] = normal(cfg.num_key_value_heads * hd, h)
        weights[p + "self_attn.o_proj.weight"] = normal(h, cfg.num_attention_heads * hd)
        weights[p + "mlp.gate_proj.weight"] = normal(i, h)
        weights[p + "mlp.up_proj.weight"] = normal(i, h)
        weights[p + "mlp.down_proj.weight"] = normal(h, i)
        weights[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        weights[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
    weights["model.norm.weight"] = np.ones(h, dtype=np.float32)
    weights["lm_head.weight"] = normal(cfg.vocab_size, h)
    return weights


def hf_config(cfg: TinyLlamaConfig, bos_token_id: int, eos_token_id: int) -> dict:
    """config.json for LlamaForCausalLM (the legacy `rope_theta` key: every transformers reads it)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **{k: v for k, v in asdict(cfg).items()},
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def train_tokenizer(vocab_size: int):
    """A byte-level BPE of at most `vocab_size` tokens, trained on CORPUS (deterministic)."""
    return train_byte_bpe(CORPUS.splitlines(), vocab_size, min_frequency=1)


def write_hf_llama(out_dir: Path, weights: Mapping[str, np.ndarray], config: dict) -> None:
    """config.json + model.safetensors (float32) for Llama-shaped `weights`."""
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2) + "\n"
    )
    save_file(
        {k: np.ascontiguousarray(v) for k, v in sorted(weights.items())}, str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )


def write_tokenizer(out_dir: Path, tok, model_max_length: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, content in tokenizer_files(tok, model_max_length).items():
        (out_dir / name).write_text(content)


def make_tiny_model(out_dir: str | Path, seed: int = 0, cfg: TinyLlamaConfig = TinyLlamaConfig()) -> Path:
    """Write the tiny model to `out_dir` (idempotent: the same seed rewrites the same bytes)."""
    if cfg.head_dim not in CPU_HEAD_DIMS:
        raise ValueError(f"head_dim {cfg.head_dim} is not one vLLM's CPU attention supports: {CPU_HEAD_DIMS}")
    out = Path(out_dir)
    tok = train_tokenizer(cfg.vocab_size)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, more than the model's {cfg.vocab_size}")
    write_tokenizer(out, tok, cfg.max_position_embeddings)
    write_hf_llama(out, random_weights(cfg, seed), hf_config(cfg, tok.token_to_id(BOS), tok.token_to_id(EOS)))
    return out


def is_complete(model_dir: str | Path) -> bool:
    return all((Path(model_dir) / name).is_file() for name in MODEL_FILES)


def parameter_count(cfg: TinyLlamaConfig = TinyLlamaConfig()) -> int:
    return sum(int(np.prod(w.shape)) for w in random_weights(cfg).values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.serve.tiny_model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = make_tiny_model(args.out_dir, args.seed)
    print(f"wrote a {parameter_count() / 1e3:.0f}k-parameter Llama to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
