"""A process with 8 CPU devices that imports a Hugging Face directory (jobs.train.hf_import), for
tests/jobs/train/test_hf_import.py (run as `python -m tests.jobs.train.hf_import_worker MODEL_DIR
IDS_NPZ OUT_NPZ`; prints one JSON line).

The parameters go onto a (2, 2, 2) mesh whose shardings split every axis of every parameter (a
3-d one over all three mesh axes; a 2-d one over two, replicated over the third: two devices of
the host hold the same block, which is read once). It writes our float32 logits for the ids in
IDS_NPZ, with the config's rope scaling and with it ignored, and the imported parameters in Hugging
Face's names; it prints what each callback read and the tracemalloc peak of an import (the second:
see `main`).
"""

from __future__ import annotations

import json
import os
import sys
import tracemalloc
from dataclasses import replace

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jobs.train import hf, hf_import
from jobs.train.model import forward, shapes


def every_axis(shape: tuple[int, ...]) -> P:
    return P(*("x", "y", "z")[: len(shape)])


def main(model_dir: str, ids_path: str, out_path: str) -> None:
    cfg, tied = hf.parse_config(hf_import.read_config(model_dir))
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("x", "y", "z"))
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, every_axis(s)), shapes(cfg), is_leaf=lambda s: isinstance(s, tuple))
    # A first import compiles the on-device transposes: JAX's tracing and compile caches are
    # Python allocations of a fixed size, whatever the model's, which on this tiny model outweigh
    # its parameters. The traced one below is the import proper: what the blocks hold.
    jax.block_until_ready(hf_import.import_checkpoint(model_dir, cfg, shardings))
    stats = hf_import.ImportStats()
    tracemalloc.start()
    params = hf_import.import_checkpoint(model_dir, cfg, shardings, stats)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    ids = jnp.asarray(np.load(ids_path)["ids"])
    logits = np.asarray(forward(params, ids, cfg))
    unscaled = np.asarray(forward(params, ids, replace(cfg, rope_factor=0.0)))
    host = jax.tree.map(np.asarray, params)
    arrays = {"logits": logits, "unscaled": unscaled, **hf.to_hf(host)}
    np.savez(out_path, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    specs_split = all(all(axis is not None for axis in a.sharding.spec) and len(a.sharding.spec) == a.ndim for a in jax.tree.leaves(params))
    print(
        json.dumps(
            {
                "reads": [[key, at, n] for key, at, n in stats.reads],
                "peak": peak,
                "param_bytes": sum(a.size * 4 for a in jax.tree.leaves(params)),
                "every_axis_split": specs_split,
                "tied": tied,
                "seconds": stats.seconds,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
