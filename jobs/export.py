"""Export a training run's newest whole checkpoint as a Hugging Face Llama directory, ready for vLLM
(`serving.model` can point at it in the environment's bucket).

    python -m jobs.export --storage DIR|gs://... --name RUN --out DIR|gs://... [--tokenizer PATH]

Writes `config.json` (LlamaForCausalLM), `generation_config.json`, `model.safetensors` (float32,
Hugging Face's tensor names: jobs.train.hf) and the tokenizer files (`tokenizer.json`,
`tokenizer_config.json` with a chat template, `special_tokens_map.json`). The tokenizer is the one
the run trained with (kept in its directory), unless `--tokenizer` names another.

Reads only the parameters (not the optimizer state), onto this machine's first device: no slice
needed. A local `--out` appears whole or not at all (written beside it, then renamed); on gs://,
`config.json` is written last, so a directory without it is not a model.

Exit status: 0 exported, 1 no whole checkpoint or a path that cannot be written, 2 bad flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobs.runtime import storage

# Written last: its presence is what makes the directory a model.
LAST = "config.json"


class ExportError(Exception):
    """Nothing to export, or nowhere to write it; the message says which."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jobs.export", description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", required=True, help="the training runs' storage: a directory or gs://... (jobs.train --storage)")
    p.add_argument("--name", required=True, help="the run (jobs.train --name)")
    p.add_argument("--out", required=True, help="the model directory to write: a directory or gs://...")
    p.add_argument("--tokenizer", default=None, help="a tokenizer.json to ship instead of the run's own")
    return p


def export(storage_path: str, run: str, out: str, tokenizer: str | None = None, log=print) -> dict[str, Any]:
    """Write the export; what was exported (step, checkpoint, files)."""
    import jax
    import numpy as np
    from safetensors.numpy import save

    from jobs.runtime.hf_tokenizer import tokenizer_files
    from jobs.train import checkpoints, hf
    from jobs.train.model import ModelConfig, shapes
    from jobs.train.text import DataError, eos_id, load_tokenizer

    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's notes on a read-only manager are not ours
    root = checkpoints.run_root(storage_path, run)
    if not storage.exists(root):
        raise ExportError(f"there is no run {run!r} in {storage_path} ({root} does not exist)")
    manager = checkpoints.open_manager(root, asynchronous=False, keep=None, read_only=True)  # the run may be saving
    steps = sorted(manager.all_steps(), reverse=True)
    if not steps:
        raise ExportError(f"run {run!r} has no committed checkpoint in {root}")
    meta = _newest_meta(manager, steps)
    if meta is None:
        raise ExportError(f"no checkpoint of run {run!r} in {root} has a meta that reads back")
    cfg = ModelConfig(**meta["model"])
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(
        lambda shape: jax.ShapeDtypeStruct(shape, np.float32, sharding=device), shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)
    )
    found = checkpoints.restore_newest(manager, cfg.to_dict(), abstract, log=log)
    if found is None:
        raise ExportError(f"no checkpoint of run {run!r} in {root} reads back whole")
    kept = storage.join(root, checkpoints.TOKENIZER_FILE)
    tokenizer = tokenizer or (kept if storage.exists(kept) else "")
    if not tokenizer:
        raise ExportError(f"run {run!r} trained on synthetic tokens and kept no tokenizer: pass --tokenizer")
    try:
        _, tok = load_tokenizer(tokenizer)
        eos = eos_id(tok, tokenizer)
    except DataError as err:
        raise ExportError(f"--tokenizer: {err}") from None
    if tok.get_vocab_size() > cfg.vocab:
        raise ExportError(f"the tokenizer {tokenizer} has {tok.get_vocab_size()} tokens, more than the model's vocab of {cfg.vocab}")

    params = jax.tree.map(np.asarray, found.params)
    config = {**hf.hf_config(cfg), "eos_token_id": eos}
    bos = tok.encode("").ids
    if bos:
        config["bos_token_id"] = bos[0]
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    files: dict[str, bytes] = {
        "model.safetensors": save(hf.to_hf(params), metadata={"format": "pt"}),
        "generation_config.json": (json.dumps(generation, indent=2) + "\n").encode(),
        **{name: text.encode() for name, text in tokenizer_files(tok, cfg.seq_len).items()},
        LAST: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
    }
    _write(out, files)
    return {"run": run, "step": found.step, "checkpoint": found.where, "out": out, "files": sorted(files), "tokenizer": tokenizer}


def _newest_meta(manager: Any, steps: list[int]) -> dict[str, Any] | None:
    """The meta (step, model) of the newest of `steps` whose meta reads back."""
    import orbax.checkpoint as ocp

    for step in steps:
        try:
            return dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
        except Exception:  # Orbax raises many kinds; restore_newest says why when it skips one
            continue
    return None


def _write(out: str, files: dict[str, bytes]) -> None:
    if storage.is_remote(out):
        for name, data in files.items():  # dicts keep order: config.json last
            storage.write_bytes(storage.join(out, name), data)
        return
    final = Path(out).resolve()
    if final.exists() and not (final / LAST).is_file() and any(final.iterdir()):
        raise ExportError(f"{final} exists and is not a model directory; refusing to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        for name, data in files.items():
            (staging / name).write_bytes(data)
        if final.exists():
            shutil.rmtree(final)  # an older export of a model: replaced whole
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        done = export(args.storage, args.name, args.out, args.tokenizer)
    except (ExportError, storage.StorageError, OSError) as err:
        print(f"export: error: {err}", file=sys.stderr)
        return 1
    print(f"export: {args.name} step {done['step']} ({done['checkpoint']}) -> {done['out']}: {', '.join(done['files'])}")
    print("EXPORT " + json.dumps(done), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
