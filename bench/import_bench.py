"""Benchmark of `jobs.train --init-from` (`make bench`): how fast a host places a Hugging Face
model's bytes on its devices (jobs.train.hf_import: each device's block sliced out of the
safetensors files, transposed and stacked into the run's sharding), against a bare safetensors
read of the same bytes (`get_tensor` of every tensor) on the same host.

    python bench/import_bench.py [--preset 125m] [--devices 4] [--repeats 3]

The source is a random model of the preset's shape in Hugging Face's layout (float32, sharded in
~200 MB files with an index, as `save_pretrained` writes one), made with numpy and safetensors. One
process with `--devices` CPU devices (a v6e host's 4 chips), parameters sharded over them as
jobs.train shards them (fsdp over every device). Both reads come from the page cache (the file was
just written, and each is run `--repeats` times, alternating; the best of each is kept): what is
compared is the import's work over the read's, not the disk.

The import reads each block with `get_slice` in Hugging Face's layout and transposes it on the
devices (a host-side transpose was 1.7x slower overall). What bounds it on CPU is `get_slice`
itself: a block of a parameter sharded over its input dimension is a column slice of the Hugging
Face tensor, a strided copy about 2x slower than `get_tensor`'s contiguous one (a thread pool over
the reads gained nothing measurable on a 2-core machine; untried on a TPU host's many cores).

Target: import >= 0.8x the bare read's bytes per second. A benchmark, not a test: it prints what it
measures whether or not the target is met.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
TARGET = 0.8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from safetensors import safe_open

    from jobs.train import hf, hf_import
    from jobs.train.model import DATA_AXIS, FSDP_AXIS, PRESETS, param_count, param_specs, shapes

    cfg = PRESETS[args.preset]
    rng = np.random.default_rng(0)
    ours = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, np.float32), shapes(cfg), is_leaf=lambda s: isinstance(s, tuple))
    mesh = Mesh(np.array(jax.devices()).reshape(1, -1), (DATA_AXIS, FSDP_AXIS))
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(ours, len(jax.devices())))
    with tempfile.TemporaryDirectory(prefix="import-bench-") as tmp:
        model_dir = Path(tmp) / "model"
        tensors = {name: rng.standard_normal(shape, np.float32) for name, shape in hf_import.hf_shapes(cfg, tied=False).items()}
        files = hf_import.write_dir(model_dir, hf.hf_config(cfg), tensors, shard_bytes=200 * 2**20)
        del tensors
        total = sum((model_dir / f).stat().st_size for f in files)
        print(
            f"import bench: {args.preset} ({param_count(cfg) / 1e6:.0f}M parameters, {total / 2**20:,.0f} MiB float32 in {len(files)} files)"
        )
        print(f"  on one host of {len(jax.devices())} {jax.devices()[0].platform} devices, fsdp over all of them")

        def bare() -> tuple[int, float]:
            started, nbytes = time.perf_counter(), 0
            for name in files:
                with safe_open(model_dir / name, "numpy") as f:
                    for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        nbytes += f.get_tensor(key).nbytes
            return nbytes, time.perf_counter() - started

        def imported() -> tuple[int, float]:
            stats = hf_import.ImportStats()
            params = hf_import.import_checkpoint(str(model_dir), cfg, shardings, stats)
            placed = sum(shard.data.nbytes for a in jax.tree.leaves(params) for shard in a.addressable_shards)
            del params
            return placed, stats.seconds

        best_bare, best_import = float("inf"), float("inf")
        first_import = 0.0
        for _ in range(args.repeats):
            bare_bytes, seconds = bare()
            best_bare = min(best_bare, seconds)
            placed, seconds = imported()
            best_import = min(best_import, seconds)
            first_import = first_import or seconds
    bare_rate, import_rate = bare_bytes / best_bare, placed / best_import
    ratio = import_rate / bare_rate
    print(f"  bare safetensors read: {bare_bytes / 2**20:,.0f} MiB in {best_bare:.2f} s = {bare_rate / 2**20:,.0f} MiB/s")
    print(f"  import onto devices:   {placed / 2**20:,.0f} MiB in {best_import:.2f} s = {import_rate / 2**20:,.0f} MiB/s")
    print(f"    (the first import, compiling its on-device transposes and with cold caches: {first_import:.2f} s)")
    print(f"  ratio import / bare read = {ratio:.2f}x (target >= {TARGET}x: {'met' if ratio >= TARGET else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
