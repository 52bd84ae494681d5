"""`python -m jobs.export` (its output is checked by transformers in tests/jobs/train/test_hf_numerics.py
and by vLLM in tests/jobs/serve/test_serve_e2e.py; from and to gs:// in tests/jobs/runtime/test_storage.py):
what it refuses, in one line, without touching what is there."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jobs import export as export_cli
from jobs.train import checkpoints, text
from jobs.train.model import ModelConfig, init_params

CFG = ModelConfig(vocab=text.VOCAB, seq_len=24, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=160)


def save_run(storage, name: str, params, step: int = 5, cfg: ModelConfig = CFG, **notes: str) -> None:
    """An Orbax checkpoint of `params` (and a fresh Adam state), as jobs.train writes one."""
    import optax

    params = jax.tree.map(jnp.asarray, params)
    if notes.get("tokenizer"):  # as rank 0 of jobs.train keeps it
        checkpoints.keep_tokenizer(checkpoints.run_root(str(storage), name), notes["tokenizer"])
    manager = checkpoints.open_manager(checkpoints.run_root(str(storage), name), asynchronous=False)
    checkpoints.save(manager, step, params, optax.adam(1e-3).init(params), cfg.to_dict(), **notes)
    manager.close()


def test_export_refuses_with_one_line_what_it_cannot_do(tmp_path, capsys):
    runs, out = str(tmp_path / "runs"), str(tmp_path / "model")

    def refused(*argv: str) -> str:
        assert export_cli.main(list(argv)) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("export: error: ")
        return err

    assert "there is no run 'nope'" in refused("--storage", runs, "--name", "nope", "--out", out)
    save_run(tmp_path / "runs", "synthetic", init_params(CFG, 0))
    assert "kept no tokenizer: pass --tokenizer" in refused("--storage", runs, "--name", "synthetic", "--out", out)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    err = refused("--storage", runs, "--name", "synthetic", "--out", out, "--tokenizer", str(text.TOKENIZER))
    assert "is not a model directory; refusing to replace it" in err
    assert (tmp_path / "model" / "notes.txt").read_text() == "mine"


def test_export_of_a_run_still_training_leaves_its_save_in_flight_alone(tmp_path):
    save_run(tmp_path / "runs", "live", init_params(CFG, 0), tokenizer=str(text.TOKENIZER))
    # What Orbax writes while a save is on its way to its commit (the training run is saving now).
    in_flight = tmp_path / "runs" / "live" / f"{checkpoints.dir_name(10)}.orbax-checkpoint-tmp-1764800000"
    (in_flight / "params").mkdir(parents=True)
    (in_flight / "params" / "part").write_bytes(b"x" * 100)
    assert export_cli.main(["--storage", str(tmp_path / "runs"), "--name", "live", "--out", str(tmp_path / "model")]) == 0
    assert (in_flight / "params" / "part").read_bytes() == b"x" * 100  # not cleaned up under the run
    assert (tmp_path / "model" / "config.json").is_file()
