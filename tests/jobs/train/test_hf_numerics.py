"""The JAX model against an implementation nobody here wrote: Hugging Face `transformers` (in
.venv-serve, where vLLM's dependencies put it) loads what `python -m jobs.export` wrote from an
Orbax checkpoint (config, safetensors, tokenizer), tokenizes a prompt as we do, and computes the
same logits in float32."""

from __future__ import annotations

import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jobs import REPO_ROOT
from jobs import export as export_cli
from jobs.serve.tiny_model import MODEL_FILES
from jobs.train import text
from jobs.train.hf import from_hf, to_hf
from jobs.train.model import ModelConfig, forward, init_params
from tests.jobs.test_export import save_run

SERVE_PYTHON = REPO_ROOT / ".venv-serve" / "bin" / "python"
# vocab: the shipped tokenizer's 512 tokens
CFG = ModelConfig(vocab=512, seq_len=24, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=160, rope_theta=500_000.0)
PROMPT = "Ray Train reserves whole TPU slices."

HF_LOGITS = """
import sys
import numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, prompt, out = sys.argv[1:]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
ids = AutoTokenizer.from_pretrained(model_dir)(prompt, return_tensors="pt").input_ids
with torch.no_grad():
    logits = model(ids).logits
np.savez(out, ids=ids.numpy(), logits=logits.float().numpy())
"""


def test_the_hugging_face_names_round_trip():
    params = init_params(CFG, 0)
    back = from_hf(to_hf(params), CFG)
    assert jax.tree.all(jax.tree.map(np.array_equal, params, back))
    assert len(to_hf(params)) == 3 + 9 * CFG.n_layers


@pytest.mark.skipif(not SERVE_PYTHON.exists(), reason=".venv-serve is not set up (`make serve-setup`)")
def test_transformers_loads_the_export_and_computes_the_same_logits(tmp_path):
    params = init_params(CFG, 7)
    save_run(tmp_path / "runs", "r", params, cfg=CFG, tokenizer=str(text.TOKENIZER))
    assert export_cli.main(["--storage", str(tmp_path / "runs"), "--name", "r", "--out", str(tmp_path / "model")]) == 0
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == sorted(MODEL_FILES)
    proc = subprocess.run(
        [str(SERVE_PYTHON), "-c", HF_LOGITS, str(tmp_path / "model"), PROMPT, str(tmp_path / "theirs.npz")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = np.load(tmp_path / "theirs.npz")
    ids = text.tokenizer_from_json(text.TOKENIZER.read_text()).encode(PROMPT).ids
    assert theirs["ids"].tolist() == [ids]  # the same tokens, BOS first
    ours = np.asarray(forward(jax.tree.map(jnp.asarray, params), jnp.asarray([ids]), CFG))
    assert theirs["logits"].shape == ours.shape == (1, len(ids), CFG.vocab)
    np.testing.assert_allclose(ours, theirs["logits"], rtol=1e-4, atol=1e-4)
    assert (ours.argmax(-1) == theirs["logits"].argmax(-1)).all()
