"""The JAX model against an implementation nobody here wrote: Hugging Face `transformers`'
`LlamaForCausalLM` (in .venv-serve, where vLLM's dependencies put it), loaded with our parameters
under their names (jobs.train.hf), computes the same logits in float32."""

from __future__ import annotations

import json
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jobs import REPO_ROOT
from jobs.train.hf import from_hf, hf_config, to_hf
from jobs.train.model import ModelConfig, forward, init_params

SERVE_PYTHON = REPO_ROOT / ".venv-serve" / "bin" / "python"
CFG = ModelConfig(vocab=96, seq_len=24, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=160, rope_theta=500_000.0)

HF_LOGITS = """
import json, sys
import numpy as np, torch
from transformers import LlamaConfig, LlamaForCausalLM

weights, config, tokens, out = sys.argv[1:]
settings = {k: v for k, v in json.load(open(config)).items() if k not in ("architectures", "torch_dtype")}
model = LlamaForCausalLM(LlamaConfig(**settings, attn_implementation="eager")).eval()
state = {k: torch.from_numpy(v) for k, v in np.load(weights).items()}
missing, unexpected = model.load_state_dict(state, strict=False)
assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
with torch.no_grad():
    logits = model(torch.from_numpy(np.load(tokens))).logits
np.save(out, logits.float().numpy())
"""


def test_the_hugging_face_names_round_trip():
    params = init_params(CFG, 0)
    back = from_hf(to_hf(params), CFG)
    assert jax.tree.all(jax.tree.map(np.array_equal, params, back))
    assert len(to_hf(params)) == 3 + 9 * CFG.n_layers


@pytest.mark.skipif(not SERVE_PYTHON.exists(), reason=".venv-serve is not set up (`make serve-setup`)")
def test_transformers_llama_computes_the_same_logits(tmp_path):
    params = init_params(CFG, 7)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, (2, CFG.seq_len)).astype(np.int64)
    ours = np.asarray(forward(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens), CFG))
    np.savez(tmp_path / "weights.npz", **to_hf(params))
    (tmp_path / "config.json").write_text(json.dumps(hf_config(CFG)))
    np.save(tmp_path / "tokens.npy", tokens)
    args = [str(tmp_path / n) for n in ("weights.npz", "config.json", "tokens.npy", "theirs.npy")]
    proc = subprocess.run([str(SERVE_PYTHON), "-c", HF_LOGITS, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = np.load(tmp_path / "theirs.npy")
    assert theirs.shape == ours.shape == (2, CFG.seq_len, CFG.vocab)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
