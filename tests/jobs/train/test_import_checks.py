"""`jobs.train --init-from DIR` checks a local directory's tensors when it parses its flags, from the
safetensors headers alone: a missing tensor, a wrong shape or dtype, a missing or damaged weight
file is one line naming it, exit 2, before any slice is asked for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jobs.train import config as train_config
from jobs.train import hf, hf_import
from jobs.train.model import ModelConfig, init_params

CFG = ModelConfig(vocab=64, seq_len=16, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=48)
UP = "model.layers.1.mlp.up_proj.weight"


def refused(capsys, model_dir: Path) -> str:
    with pytest.raises(SystemExit) as exit_:
        train_config.parse_config(["--storage", "/tmp/unused", "--init-from", str(model_dir)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.splitlines()[0]


def source(where: Path, shard_bytes: int = 0, **changed: np.ndarray | None) -> Path:
    tensors = hf.to_hf(init_params(CFG, 0))
    for name, value in changed.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    hf_import.write_dir(where, hf.hf_config(CFG), tensors, shard_bytes=shard_bytes)
    return where


def test_a_whole_directory_passes(tmp_path):
    _, config, *_ = train_config.parse_config(["--storage", "/tmp/unused", "--init-from", str(source(tmp_path / "m", 20_000))])
    assert ModelConfig(**config.model) == CFG


@pytest.mark.parametrize("shard_bytes", [0, 20_000])
def test_a_missing_tensor_or_a_wrong_shape_or_dtype_is_named_at_parse_time(tmp_path, capsys, shard_bytes):
    err = refused(capsys, source(tmp_path / "missing", shard_bytes, **{UP: None}))
    assert f"argument --init-from: tensor {UP} is missing from {tmp_path / 'missing'} (" in err
    err = refused(capsys, source(tmp_path / "shape", shard_bytes, **{UP: np.zeros((48, 16), np.float32)}))
    assert f"argument --init-from: tensor {UP} is [48, 16], config.json makes it [48, 32] (" in err
    err = refused(capsys, source(tmp_path / "dtype", shard_bytes, **{hf.NORM: np.ones(32, np.int32)}))
    assert f"argument --init-from: tensor {hf.NORM} is I32; one of F32, BF16, F16 imports (" in err


def test_a_missing_or_damaged_weight_file_is_named(tmp_path, capsys):
    m = source(tmp_path / "m", 20_000)
    index = json.loads((m / hf_import.INDEX_FILE).read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (m / first).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    assert f"argument --init-from: {m / first} does not open as safetensors (" in refused(capsys, m)
    (m / first).unlink()
    assert f"argument --init-from: {m / first} does not open as safetensors (" in refused(capsys, m)
    (m / hf_import.INDEX_FILE).write_text("{}")
    assert f"argument --init-from: {m / hf_import.INDEX_FILE} is not a safetensors index (KeyError" in refused(capsys, m)
    for file in m.glob("*.safetensors"):
        file.unlink()
    (m / hf_import.INDEX_FILE).unlink()
    assert f"argument --init-from: {m} has neither model.safetensors nor {hf_import.INDEX_FILE}" in refused(capsys, m)
