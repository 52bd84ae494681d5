"""Training checkpoints with Orbax: sharded, asynchronous, whole or absent.

A run's checkpoints live in its Ray Train experiment directory (`<storage>/<run>`, a directory or
gs://...), one `checkpoint_step_<step, 9 digits>` directory each, with three Orbax items:

- `params` and `opt_state`: every process writes only the shards it owns (Orbax's OCDBT format via
  TensorStore; no gather), and a restore reads each shard straight onto the device that owns it;
- `meta`: the step and the model config (JSON), read first so that a run never restores another
  model's arrays.

`save` returns once the arrays are copied off the devices; the writing runs in the background while
training goes on. Orbax's commit protocol makes a checkpoint whole or absent: it is written under a
temporary name and renamed (or, on GCS, marked with `commit_success.txt`) only after every process
has finished, so a process killed mid-save leaves only the previous checkpoints in the listing.
Orbax is the one owner of deletion (`KEEP` newest); Ray Train's `num_to_keep` stays unset.

`restore_newest` tries the committed steps newest first and skips, with the reason, one that does
not read back (a file damaged after the commit): the run resumes from the one before, and deletes
the damaged one, which it will write again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.runtime import storage
from jobs.train.model import same_model

STEP_PREFIX = "checkpoint_step"
STEP_DIGITS = 9  # zero-padded, so names sort by step
KEEP = 2  # the newest checkpoints Orbax keeps; older ones are deleted once a newer one is committed
ITEMS = ("params", "opt_state", "meta")
TOKENIZER_FILE = "tokenizer.json"  # the run's tokenizer, kept in its directory (jobs.export reads it)
_DIR_NAME = re.compile(rf"^{STEP_PREFIX}_(\d+)$")


class ModelMismatchError(ValueError):
    """The run's checkpoint is of another model."""


@dataclass(frozen=True)
class Restored:
    step: int
    params: Any
    opt_state: Any  # None when only the parameters were asked for
    where: str  # the checkpoint's directory
    meta: dict[str, Any]  # step, model and the notes it was saved with


def run_root(storage_path: str, run_name: str) -> str:
    """The run's directory: Ray Train's experiment directory, where its checkpoints go (pure)."""
    return storage.join(storage_path, run_name)


def dir_name(step: int) -> str:
    return f"{STEP_PREFIX}_{step:0{STEP_DIGITS}d}"


def step_of(name: str) -> int | None:
    """The step in a `dir_name`, or None for any other name (pure)."""
    match = _DIR_NAME.match(name)
    return int(match.group(1)) if match else None


def keep_tokenizer(root: str, tokenizer: str) -> None:
    """Copy the run's tokenizer into its directory (`TOKENIZER_FILE`), beside its checkpoints: the
    path it came from may be gone by export time (a job's working dir on the cluster)."""
    storage.write_bytes(storage.join(root, TOKENIZER_FILE), storage.read_bytes(tokenizer))


def open_manager(root: str, *, asynchronous: bool = True, keep: int | None = KEEP, read_only: bool = False):
    """An Orbax CheckpointManager over the run's directory (created if missing). Every process of
    the run opens one; Orbax coordinates them (only the primary process commits and deletes).
    `read_only` (jobs.export) creates, cleans and deletes nothing: the run may be saving right now."""
    import orbax.checkpoint as ocp

    # Orbax reaches gs:// through gcsfs (paths) and TensorStore (arrays): point TensorStore at the
    # emulator too when there is one (the tests), as gcsfs and jobs.runtime.storage already are.
    os.environ.update(storage.orbax_environment())
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        step_prefix=STEP_PREFIX,
        step_format_fixed_length=STEP_DIGITS,
        enable_async_checkpointing=asynchronous,
        create=not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,  # what a killed save left behind
    )
    return ocp.CheckpointManager(root, options=options, item_names=ITEMS)


def save(manager: Any, step: int, params: Any, opt_state: Any, model: dict[str, Any], **notes: str) -> None:
    """Start saving `step` (waits for the previous save first, then only for the copy off the
    devices); `manager.wait_until_finished()` waits for the commit. `notes` go into the meta
    (the run's tokenizer, for jobs.export)."""
    import orbax.checkpoint as ocp

    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave({**notes, "step": step, "model": dict(model)}),
        ),
    )


def restore_newest(
    manager: Any,
    model: dict[str, Any],
    abstract_params: Any,
    abstract_opt_state: Any = None,
    log: Callable[[str], None] = lambda line: None,
    agree: Callable[[bool], bool] = lambda ok: ok,
) -> Restored | None:
    """The newest committed checkpoint that reads back, placed as the abstract trees say
    (`jax.ShapeDtypeStruct`s with shardings); None if there is none. Only the parameters when
    `abstract_opt_state` is None. Raises `ModelMismatchError` for another model's checkpoint.

    Every process reads only its own shards, so damage can show on some processes only: `agree`
    (a collective in a multi-process run) makes them all accept a step or all skip it. A skipped
    step is deleted (collectively) when the optimizer state is restored, i.e. by a run that goes
    on: it will write that step again."""
    import jax
    import orbax.checkpoint as ocp

    for step in sorted(manager.all_steps(), reverse=True):
        where = f"{manager.directory}/{dir_name(step)}"
        problem, restored = None, None
        try:
            meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as err:  # Orbax and TensorStore raise many kinds; the reason is logged
            meta, problem = None, f"its meta does not read back ({_reason(err)})"
        if meta is not None and not same_model(meta.get("model") or {}, dict(model)):
            raise ModelMismatchError(
                f"the checkpoint {where} is of another model ({meta.get('model')}; this run: {dict(model)}); "
                "pass another --name to start a new run"
            )
        if problem is None:
            items = {"params": ocp.args.StandardRestore(abstract_params)}
            if abstract_opt_state is not None:
                items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
            try:
                restored = manager.restore(step, args=ocp.args.Composite(**items))
            except Exception as err:
                problem = f"its arrays do not read back ({_reason(err)})"
        if not agree(problem is None):
            log(f"skipping checkpoint {where}: {problem or 'another process could not read its shards'}")
            if abstract_opt_state is not None:
                manager.delete(step)
            continue
        assert restored is not None  # agreed, so this process read it
        opt_state = None
        if abstract_opt_state is not None:  # Orbax gives containers back as lists/tuples: our tree again
            opt_state = jax.tree.unflatten(jax.tree.structure(abstract_opt_state), jax.tree.leaves(restored["opt_state"]))
        params = jax.tree.unflatten(jax.tree.structure(abstract_params), jax.tree.leaves(restored["params"]))
        return Restored(step, params, opt_state, where, dict(meta or {}))
    return None


def all_processes_agree(ok: bool) -> bool:
    """True on every process when `ok` is true on every process (a collective)."""
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.array([int(ok)], np.int32))).min())


def _reason(err: BaseException) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {first[:300]}"
