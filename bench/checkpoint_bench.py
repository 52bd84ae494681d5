"""Benchmark of checkpointing (`make bench`): how long the training loop is blocked per checkpoint,
Orbax async (jobs.train.checkpoints) against a synchronous gather-and-write of the same state.

    python bench/checkpoint_bench.py [--preset 125m] [--generation v6e --topology 4x4]

One process per host of the simulated slice (`jax.distributed` on 127.0.0.1, one CPU device per
chip), each holding its shards of the preset's parameters and Adam state (ShardedState: sharded
over every chip of the slice, as jobs.train shards them). Measured, on every process:

- async: `checkpoints.save` (what the loop waits for: the copy off the devices), then the time to
  the commit (`wait_until_finished`), then a restore of the newest checkpoint onto the same sharding;
- sync: what a loop would wait for without Orbax: gather every array onto every process
  (`process_allgather`), then process 0 writes one `.npz` and fsyncs it.

Ratio: async stall / sync (target <= 0.2x). Also prints save and restore throughput. A benchmark,
not a test: it prints what it measures whether or not the target is met.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def one_process(process_id: int, num_processes: int, port: int, root: str, argv: list[str]) -> None:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from jobs.train import checkpoints
    from jobs.train import config as train_config
    from jobs.train import state as train_state

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id, initialization_timeout=300)
    _, config, *_ = train_config.parse_config(["--generation", argv[0], "--topology", argv[1], "--storage", root, "--preset", argv[2]])
    state = train_state.ShardedState(config)
    leaves = jax.tree.leaves((state.params, state.opt_state))
    state_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)
    out: dict[str, float] = {"state_bytes": state_bytes}

    manager = checkpoints.open_manager(f"{root}/orbax")
    multihost_utils.sync_global_devices("start")
    begin = time.perf_counter()
    checkpoints.save(manager, 1, state.params, state.opt_state, state.cfg.to_dict())
    out["async_stall_s"] = time.perf_counter() - begin
    manager.wait_until_finished()
    out["async_commit_s"] = time.perf_counter() - begin

    multihost_utils.sync_global_devices("restore")
    params, opt_state = state.abstract()
    begin = time.perf_counter()
    found = checkpoints.restore_newest(manager, state.cfg.to_dict(), params, opt_state, agree=checkpoints.all_processes_agree)
    out["restore_s"] = time.perf_counter() - begin
    assert found is not None and found.step == 1
    manager.close()

    multihost_utils.sync_global_devices("sync")
    begin = time.perf_counter()
    gathered = multihost_utils.process_allgather(leaves, tiled=True)
    if process_id == 0:
        path = Path(root) / "state.npz"
        with open(path, "wb") as f:
            np.savez(f, *gathered)
            f.flush()
            os.fsync(f.fileno())
    multihost_utils.sync_global_devices("written")
    out["sync_s"] = time.perf_counter() - begin
    print(json.dumps(out), flush=True)
    jax.distributed.shutdown()


def launch(args: argparse.Namespace, root: str) -> list[dict[str, float]]:
    from per_host import run_per_host

    from infra import catalog
    from jobs.runtime.net import free_port

    shape = catalog.shape(args.generation, args.topology)
    port = free_port()
    argv = [str(shape.hosts), str(port), root, args.generation, args.topology, args.preset]
    return run_per_host(shape, lambda i: [__file__, "--process", str(i), *argv], args.timeout)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--process":
        a = sys.argv[2:]
        one_process(int(a[0]), int(a[1]), int(a[2]), a[3], a[4:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--generation", default="v6e")
    parser.add_argument("--topology", default="4x4")
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args(argv)

    from jobs.train.model import PRESETS, param_count

    params = param_count(PRESETS[args.preset])
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir=REPO_ROOT / "build" if (REPO_ROOT / "build").is_dir() else None) as root:
        results = launch(args, root)
    worst = {k: max(r[k] for r in results) for k in results[0]}  # the slowest process sets the pace
    gib = worst["state_bytes"] / 2**30
    ratio = worst["async_stall_s"] / worst["sync_s"]
    print(
        f"checkpoint bench: {args.preset} preset ({params / 1e6:.0f}M parameters; with Adam state {gib:.2f} GiB) on a simulated {args.generation} {args.topology}"
    )
    print(f"  Orbax async: training blocked {worst['async_stall_s']:.2f} s per save; committed after {worst['async_commit_s']:.2f} s")
    print(f"  sync gather-and-write: {worst['sync_s']:.2f} s")
    print(
        f"  save throughput {gib / worst['async_commit_s']:.2f} GiB/s, restore {gib / worst['restore_s']:.2f} GiB/s ({worst['restore_s']:.2f} s)"
    )
    print(f"  ratio stall / sync = {ratio:.3f}x (target <= 0.2x: {'met' if ratio <= 0.2 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
