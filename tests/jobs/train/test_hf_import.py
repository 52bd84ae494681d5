"""`jobs.train --init-from`: a Hugging Face Llama directory read into the run's sharding
(jobs.train.hf_import), its config.json parsed (jobs.train.hf.parse_config), Llama 3's rope scaling
(jobs.train.model.inv_frequencies), and every refusal as one line naming the key or flag.

The numeric check is against transformers (in .venv-serve): a random tiny LlamaForCausalLM with
grouped-query attention, llama3 rope scaling and tied embeddings, saved in several shards."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from jobs import REPO_ROOT
from jobs.train import config as train_config
from jobs.train import hf, hf_import, text
from jobs.train.model import ModelConfig, init_params, inv_frequencies, shapes

SERVE_PYTHON = REPO_ROOT / ".venv-serve" / "bin" / "python"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
# vocab: the shipped tokenizer's 512 tokens; a head dim of 16 and theta 10^4 put the llama3 bands
# (wavelengths 8..32 positions) inside a 48-token sequence.
CFG = ModelConfig(vocab=text.VOCAB, seq_len=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, rope_theta=10_000.0)
NEW_STYLE: dict[str, Any] = {
    **hf.hf_config(CFG),
    "rope_parameters": {"rope_theta": 10_000.0, **LLAMA3},
    "dtype": "bfloat16",
    "tie_word_embeddings": True,
}
for key in ("rope_theta", "torch_dtype"):
    del NEW_STYLE[key]
OLD_STYLE: dict[str, Any] = {**hf.hf_config(CFG), "rope_scaling": {**LLAMA3, "type": "llama3"}, "tie_word_embeddings": True}
del OLD_STYLE["rope_scaling"]["rope_type"]  # 4.x's oldest spelling: `type`
SCALED = replace(CFG, rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_positions=32)

MAKE_LLAMA = """
import json, sys
import numpy as np, torch
from transformers import LlamaConfig, LlamaForCausalLM

out, dtype, npz = sys.argv[1:]
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
    rope_parameters={"rope_theta": 10000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    attn_implementation="eager",
)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():  # norms away from 1, so that a norm read in the wrong place shows
    for name, p in model.named_parameters():
        if "norm" in name:
            p.uniform_(0.5, 1.5)
model = model.to(getattr(torch, dtype))
model.save_pretrained(out, max_shard_size="50KB")
ids = np.random.default_rng(0).integers(0, 512, (2, 48))
with torch.no_grad():
    logits = model.float()(torch.tensor(ids)).logits
np.savez(npz, ids=ids, logits=logits.numpy())
"""


# --- config.json -------------------------------------------------------------------------------


def test_both_config_spellings_parse_to_the_same_model():
    assert hf.parse_config(NEW_STYLE) == hf.parse_config(OLD_STYLE) == (SCALED, True)
    assert hf.parse_config(hf.hf_config(CFG)) == (CFG, False)


def test_the_export_writes_the_rope_scaling_back():
    written = hf.hf_config(SCALED)
    assert written["rope_scaling"] == LLAMA3 and written["tie_word_embeddings"] is False
    assert hf.parse_config(written) == (SCALED, False)
    assert "rope_factor" not in CFG.to_dict() and SCALED.to_dict()["rope_factor"] == 8.0  # old checkpoints' meta still match


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"head_dim": 32}, "head_dim"),
        ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}}, "rope_parameters.rope_type"),
        ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", "factor": 4.0}}, "rope_parameters.low_freq_factor"),
        ({"architectures": ["MistralForCausalLM"]}, "architectures"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"dtype": "int8"}, "dtype"),
    ],
)
def test_what_the_model_cannot_represent_is_refused_naming_the_key(change, key):
    with pytest.raises(hf.HFConfigError) as err:
        hf.parse_config({**NEW_STYLE, **change})
    assert err.value.key == key and str(err.value).startswith(f"{key}: ") and "\n" not in str(err.value)


def test_llama3_scaling_keeps_high_frequencies_divides_low_ones_and_blends_between():
    plain, scaled = inv_frequencies(CFG), inv_frequencies(SCALED)
    wavelen = 2 * math.pi / plain
    high, low = wavelen < 32 / 4, wavelen > 32 / 1
    assert high.any() and low.any() and (~high & ~low).any()  # all three bands in this config
    np.testing.assert_array_equal(scaled[high], plain[high])
    np.testing.assert_allclose(scaled[low], plain[low] / 8, rtol=1e-6)
    middle = ~high & ~low
    assert ((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)).all()


# --- the block mapping -------------------------------------------------------------------------


def assemble(tensors: dict[str, np.ndarray], reads: list[hf_import.Read], block_shape) -> np.ndarray:
    """What read_block does, on in-memory tensors."""
    block = np.empty(block_shape, np.float32)
    for r in reads:
        piece = tensors[r.name][r.index]
        block[... if r.layer is None else r.layer] = piece.T if r.transposed else piece
    return block


@pytest.mark.parametrize("tied", [False, True])
def test_every_block_of_every_parameter_is_made_of_its_hugging_face_slices(tied):
    params = init_params(CFG, 3)
    if tied:
        params["lm_head"] = params["embed"].T.copy()
    tensors = hf.to_hf(params)
    if tied:
        del tensors[hf.HEAD]
    tree = shapes(CFG)
    for key in hf_import.leaf_keys(tree):
        ours = params["layers"][key[7:]] if key.startswith("layers/") else params[key]
        shape = ours.shape
        # every axis split in two, and the layer axis also one layer at a time
        for parts in ([2] * len(shape), [1] + [2] * (len(shape) - 1), [len(shape) and shape[0]] + [1] * (len(shape) - 1)):
            for corner in np.ndindex(*parts):
                index = tuple(slice(c * n // p, (c + 1) * n // p) for c, n, p in zip(corner, shape, parts, strict=True))
                reads = hf_import.block_reads(key, index, shape, tied)
                block = assemble(tensors, reads, ours[index].shape)
                np.testing.assert_array_equal(block, ours[index], err_msg=f"{key} {index}")
                assert sum(tensors[r.name][r.index].size for r in reads) == ours[index].size  # nothing but the block


def test_an_import_on_one_device_gives_back_what_was_written_and_refuses_a_wrong_tensor(tmp_path):
    params = init_params(CFG, 1)
    hf_import.write_dir(tmp_path / "m", hf.hf_config(CFG), hf.to_hf(params), shard_bytes=100_000)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, shapes(CFG), is_leaf=lambda s: isinstance(s, tuple))
    got = hf_import.import_checkpoint(str(tmp_path / "m"), CFG, shardings)
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), b), got, params))
    bad = dict(hf.to_hf(params), **{"model.layers.1.mlp.up_proj.weight": np.zeros((96, 32), np.float32)})
    hf_import.write_dir(tmp_path / "bad", hf.hf_config(CFG), bad)
    with pytest.raises(
        hf_import.HFImportError, match=r"tensor model.layers.1.mlp.up_proj.weight is \[96, 32\], config.json makes it \[96, 64\]"
    ):
        hf_import.import_checkpoint(str(tmp_path / "bad"), CFG, shardings)


def test_an_import_from_gcs_gives_what_the_local_one_gives(tmp_path, gcs):
    from jobs.runtime import storage

    params = init_params(CFG, 2)
    files = hf_import.write_dir(tmp_path / "m", hf.hf_config(CFG), hf.to_hf(params), shard_bytes=100_000)
    for name in [*files, hf_import.INDEX_FILE, hf_import.CONFIG_FILE]:
        storage.write_bytes(f"{gcs}/m/{name}", (tmp_path / "m" / name).read_bytes())
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, shapes(CFG), is_leaf=lambda s: isinstance(s, tuple))
    got = hf_import.import_checkpoint(f"{gcs}/m", CFG, shardings)
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), b), got, params))
    assert "MiB copied to this host's" in hf_import.cache_note(f"{gcs}/m")


# --- against transformers ----------------------------------------------------------------------


# bfloat16 (the same import, halved) runs in make test-slow: make test stays under 12 minutes on 2 cores.
@pytest.fixture(scope="module", params=["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def llama_dir(request, tmp_path_factory) -> tuple[Path, str]:
    if not SERVE_PYTHON.exists():
        pytest.skip(".venv-serve is not set up (`make serve-setup`)")
    where = tmp_path_factory.mktemp(f"llama-{request.param}")
    proc = subprocess.run(
        [str(SERVE_PYTHON), "-c", MAKE_LLAMA, str(where / "model"), request.param, str(where / "theirs.npz")],
        capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.copy(text.TOKENIZER, where / "model" / "tokenizer.json")
    return where, request.param


def run_worker(where: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.jobs.train.hf_import_worker", str(where / "model"), str(where / "theirs.npz"), str(where / "ours.npz")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_a_transformers_llama_imports_on_8_devices_and_computes_its_logits(llama_dir):
    where, dtype = llama_dir
    files = json.loads((where / "model" / hf_import.INDEX_FILE).read_text())["weight_map"]
    assert len(set(files.values())) > 2 and hf.HEAD not in files  # several shards; the head is tied
    config = json.loads((where / "model" / "config.json").read_text())
    cfg, tied = hf.parse_config(config)
    assert cfg == SCALED and tied
    got = run_worker(where)
    assert got["every_axis_split"] and got["tied"]
    theirs, ours = np.load(where / "theirs.npz"), np.load(where / "ours.npz")
    np.testing.assert_allclose(ours["logits"], theirs["logits"], rtol=1e-4, atol=1e-4)
    assert not np.allclose(ours["unscaled"], theirs["logits"], rtol=1e-4, atol=1e-4)  # the rope scaling matters here

    # Each callback read its own block (in the source's dtype) and nothing else; a block two
    # devices of the host share was read once.
    itemsize = 4 if dtype == "float32" else 2
    unique: dict[tuple[str, tuple], int] = {}
    for key, at, nbytes in got["reads"]:
        size = int(np.prod([b - a for a, b in at])) * itemsize
        assert nbytes in (0, size), (key, at, nbytes)
        unique[(key, tuple(map(tuple, at)))] = unique.get((key, tuple(map(tuple, at))), 0) + nbytes
    assert all(n == int(np.prod([b - a for a, b in at])) * itemsize for (_, at), n in unique.items())
    assert len(got["reads"]) == 8 * len(hf_import.leaf_keys(shapes(cfg)))  # one callback per device
    # Python-side peak: under this host's share of the model (all of it: one host) plus one tensor.
    largest = max(int(np.prod(s)) * 4 for s in hf_import.hf_shapes(cfg, tied).values())
    assert got["peak"] < got["param_bytes"] + largest, got

    # What the export writes (float32) is what was imported: bit for bit from float32, the same
    # values from bfloat16; the tied head comes back as its own tensor, equal to the embedding.
    from safetensors import safe_open

    for name in files:
        with safe_open(where / "model" / files[name], "flax") as f:
            source = np.asarray(f.get_tensor(name)).astype(np.float32)
        np.testing.assert_array_equal(ours[name], source, err_msg=name)
    np.testing.assert_array_equal(ours[hf.HEAD], ours[hf.EMBED])


# --- flags -------------------------------------------------------------------------------------


def refused(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        train_config.parse_config(["--storage", "/tmp/unused", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture
def model_dir(tmp_path) -> Path:
    hf_import.write_dir(tmp_path / "m", NEW_STYLE, hf.to_hf(init_params(SCALED, 0)))
    shutil.copy(text.TOKENIZER, tmp_path / "m" / "tokenizer.json")
    return tmp_path / "m"


def test_init_from_takes_the_models_shape_and_tokenizer(model_dir):
    _, config, *_ = train_config.parse_config(["--storage", "/tmp/unused", "--init-from", str(model_dir), "--learning-rate", "0"])
    assert ModelConfig(**config.model) == SCALED
    assert config.init_from == str(model_dir) and config.tokenizer == str(model_dir / "tokenizer.json")
    assert config.learning_rate == 0.0
    _, config, *_ = train_config.parse_config(
        ["--storage", "/tmp/unused", "--init-from", str(model_dir), "--seq-len", "32", "--d-model", "64", "--batch-size", "16"]
    )
    assert ModelConfig(**config.model) == replace(SCALED, seq_len=32)


def test_init_from_refusals_are_one_line_naming_the_flag_or_key(model_dir, tmp_path, capsys):
    m = str(model_dir)
    assert "argument --preset: not with --init-from" in refused(capsys, "--init-from", m, "--preset", "tiny")
    assert "argument --d-model: 128 disagrees with hidden_size 64" in refused(capsys, "--init-from", m, "--d-model", "128")
    assert "argument --kv-heads: 4 disagrees with num_key_value_heads 2" in refused(capsys, "--init-from", m, "--kv-heads", "4")
    assert "argument --seq-len: 128 is longer than max_position_embeddings 64" in refused(capsys, "--init-from", m, "--seq-len", "128")
    assert "argument --learning-rate: -1 is not allowed" in refused(capsys, "--learning-rate", "-1")
    assert "argument --init-from:" in refused(capsys, "--init-from", str(tmp_path / "nowhere"))
    changes: list[tuple[dict[str, Any], str]] = [({"mlp_bias": True}, "mlp_bias"), ({"hidden_act": "relu"}, "hidden_act")]
    for change, key in changes:
        (model_dir / "config.json").write_text(json.dumps({**NEW_STYLE, **change}))
        err = refused(capsys, "--init-from", m)
        assert f"argument --init-from: {m}/config.json: {key}: " in err
