"""A process that saves and restores Orbax checkpoints of a state sharded over 4 CPU devices, for
tests/jobs/train/test_checkpoints.py (run as `python -m tests.jobs.train.checkpoint_worker PHASE ROOT`;
it prints one JSON line per result).

ROOT is a directory or gs://... (with STORAGE_EMULATOR_HOST, the tests' emulator).

  save ROOT     saves steps 3, 6, 9 (asynchronously) and waits for the commits
  restore ROOT  restores the newest whole checkpoint: sharded with its optimizer state, then the
                parameters alone onto one device; prints what it got and what it skipped
  mismatch ROOT restores with another model's config (must be refused)
  kill ROOT     saves step 10 and waits for it, then starts saving a large step 20 and sleeps: the
                test kills it mid-save
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jobs.runtime import storage
from jobs.train import checkpoints

MODEL = {"vocab": 64, "d_model": 32}
MESH = Mesh(np.array(jax.devices()).reshape(1, 4), ("data", "fsdp"))
SHARDED = NamedSharding(MESH, P("fsdp"))
OPTIMIZER = optax.adam(1e-3)


def state(step: int, rows: int = 64):
    params = {
        "embed": jax.device_put(jnp.full((rows, 32), float(step)), SHARDED),
        "norm": jax.device_put(jnp.arange(32.0) * step, NamedSharding(MESH, P())),
    }
    return params, jax.jit(OPTIMIZER.init)(params)


def entries(root: str) -> list[str]:
    """The names directly under `root` (a directory or gs://...)."""
    import pyarrow.fs

    fs, path = storage.filesystem(root)
    files = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True))  # GCS has objects, not directories
    return sorted({info.path[len(path) :].strip("/").split("/")[0] for info in files})


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(phase: str, root: str) -> None:
    if phase == "save":
        manager = checkpoints.open_manager(root)
        for step in (3, 6, 9):
            params, opt_state = state(step)
            checkpoints.save(manager, step, params, opt_state, MODEL)
        manager.wait_until_finished()
        emit(saved=list(manager.all_steps()))
        manager.close()
    elif phase in ("restore", "mismatch"):
        skipped: list[str] = []
        manager = checkpoints.open_manager(root)
        params, opt_state = state(0)
        spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)  # noqa: E731
        model = MODEL if phase == "restore" else {**MODEL, "d_model": 64}
        try:
            found = checkpoints.restore_newest(manager, model, jax.tree.map(spec, params), jax.tree.map(spec, opt_state), skipped.append)
        except checkpoints.ModelMismatchError as err:
            emit(refused=str(err))
            return
        one = NamedSharding(Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp")), P())
        alone = checkpoints.restore_newest(
            manager, model, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), params)
        )
        emit(
            steps=list(manager.all_steps()),
            step=found.step if found else None,
            embed=float(np.asarray(found.params["embed"]).mean()) if found else None,
            embed_spec=str(found.params["embed"].sharding.spec) if found else None,
            opt_type=type(found.opt_state).__name__ if found else None,
            adam_count=int(np.asarray(found.opt_state[0].count)) if found else None,
            alone_devices=len(alone.params["embed"].sharding.device_set) if alone else None,
            alone_opt_state=alone.opt_state if alone else "none",
            skipped=skipped,
            entries=entries(root),
        )
        manager.close()
    elif phase == "kill":
        manager = checkpoints.open_manager(root)
        params, opt_state = state(10)
        checkpoints.save(manager, 10, params, opt_state, MODEL)
        manager.wait_until_finished()
        emit(committed=10)
        params, opt_state = state(20, rows=2**21)  # 256 MiB of parameters, twice that of Adam moments...
        noise = np.random.default_rng(0).random((2**21, 32), np.float32)  # ...that do not compress
        params = {**params, "embed": jax.device_put(noise, SHARDED)}
        checkpoints.save(manager, 20, params, opt_state, MODEL)
        emit(saving=20)
        time.sleep(600)  # killed before this ends


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
