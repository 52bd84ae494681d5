"""One storage layer for local paths and gs:// (jobs.runtime.storage), checked against a local GCS
emulator (gcp-storage-emulator, PyPI): our reads and writes, Orbax checkpoints written and restored
in gs:// by real processes (gcsfs for paths, TensorStore for arrays), and an export from a gs:// run
to a gs:// model directory with the tokenizer read from gs://."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jobs import REPO_ROOT
from jobs import export as export_cli
from jobs.runtime import storage
from jobs.serve.tiny_model import MODEL_FILES
from jobs.train import checkpoints, text
from jobs.train.model import ModelConfig, init_params
from tests.jobs.test_export import save_run

# Where the emulator is not GCS: it implements no preconditions (ifGenerationMatch, which TensorStore's
# OCDBT manifest writes use), and about one save in six here gets an answer TensorStore cannot parse
# ("Malformed StorageGeneration"). That is the emulator, not the checkpoint: reported, not failed.
EMULATOR_GAP = "gcp-storage-emulator answered a TensorStore conditional write with a malformed generation"


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path):
    return str(tmp_path / "store") if request.param == "local" else request.getfixturevalue("gcs")


def test_write_read_list_and_refuse_with_the_path(root):
    storage.write_bytes(storage.join(root, "a", "b.txt"), b"hello")
    storage.write_bytes(storage.join(root, "a", "c", "d.json"), b"{}")
    storage.write_bytes(storage.join(root, "a", "_SUCCESS"), b"")
    assert storage.read_bytes(storage.join(root, "a", "b.txt")) == b"hello"
    listed = storage.list_files(storage.join(root, "a"))
    assert [p.rsplit("/a/", 1)[1] for p in listed] == ["b.txt", "c/d.json"]  # hidden markers left out
    assert list(storage.file_sizes(storage.join(root, "a")).values()) == [5, 2]
    assert list(storage.file_sizes(storage.join(root, "a", "b.txt")).values()) == [5]
    assert storage.exists(storage.join(root, "a", "b.txt")) and not storage.exists(storage.join(root, "nope"))
    with pytest.raises(storage.StorageError, match=r"/nope/x does not exist"):
        storage.read_bytes(storage.join(root, "nope", "x"))
    with pytest.raises(storage.StorageError, match=r"/nope does not exist"):
        storage.list_files(storage.join(root, "nope"))
    if not storage.is_remote(root):  # a local write is renamed into place: no partial file left
        assert sorted(os.listdir(os.path.join(root, "a"))) == ["_SUCCESS", "b.txt", "c"]


def test_orbax_checkpoints_round_trip_in_gcs(gcs):
    run = f"{gcs}/ckpt"

    def worker(phase: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.jobs.train.checkpoint_worker", phase, run],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        if proc.returncode and "Malformed StorageGeneration" in proc.stderr:
            pytest.xfail(EMULATOR_GAP)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert worker("save") == {"saved": [6, 9]}
    got = worker("restore")
    assert (got["step"], got["embed"], got["embed_spec"], got["skipped"]) == (9, 9.0, "P('fsdp',)", [])
    assert got["entries"] == [checkpoints.dir_name(6), checkpoints.dir_name(9)]  # Orbax's retention, in the bucket


def test_export_from_a_gcs_run_to_a_gcs_model_directory(gcs):
    cfg = ModelConfig(vocab=text.VOCAB, seq_len=32, d_model=64, n_layers=1, n_heads=1, n_kv_heads=1, d_ff=128)
    tokenizer = f"{gcs}/tokenizer.json"
    storage.write_bytes(tokenizer, text.TOKENIZER.read_bytes())
    try:
        save_run(f"{gcs}/runs", "r", init_params(cfg, 0), cfg=cfg, tokenizer=tokenizer)
    except Exception as err:
        if "Malformed StorageGeneration" in str(err):
            pytest.xfail(EMULATOR_GAP)
        raise

    assert export_cli.main(["--storage", f"{gcs}/runs", "--name", "r", "--out", f"{gcs}/models/m"]) == 0
    names = sorted(p.rsplit("/", 1)[1] for p in storage.list_files(f"{gcs}/models/m"))
    assert names == sorted(MODEL_FILES)
    config = json.loads(storage.read_bytes(f"{gcs}/models/m/config.json"))
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == text.VOCAB
    assert storage.read_bytes(f"{gcs}/models/m/tokenizer.json").decode() == text.tokenizer_from_json(text.TOKENIZER.read_text()).to_str()
