"""The SPMD training loop each Ray Train worker runs (one per host; `jax.distributed` is set up by
Ray Train's JAX backend): Ray Data batches in, a checkpoint and `StepMetrics` out every N steps,
and a `StepWatchdog` that turns a hang into an exit the driver reads as one."""

from __future__ import annotations

import itertools
import logging
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jobs.runtime import progress
from jobs.train import checkpoints
from jobs.train.config import StepMetrics, TrainConfig, mfu
from jobs.train.model import flops_per_token, param_count
from jobs.train.state import ShardedState

# Bound on waiting for the first batch from Ray Data.
DATA_TIMEOUT_S = 600.0
# Where the attempt's ProgressBoard handle travels in `train_loop_config` (not a TrainConfig field:
# an actor handle, not a number).
BOARD_KEY = "progress_board"


def _latest_over_processes(wall_time: float) -> float:
    """The latest of every process's `wall_time` (a collective). JAX keeps 32-bit numbers, too
    coarse for a Unix time, so each process sends its milliseconds as two 20-bit halves."""
    import numpy as np
    from jax.experimental import multihost_utils

    ms = int(wall_time * 1000)
    halves = np.asarray(multihost_utils.process_allgather(np.array([ms >> 20, ms & 0xFFFFF], np.int32)))
    return float(max((int(hi) << 20) + int(lo) for hi, lo in halves.reshape(-1, 2))) / 1000


def train_loop_per_worker(config_dict: dict[str, Any]) -> None:
    """The SPMD program every Ray Train worker runs (one per host; jax.distributed is set up)."""
    import ray.train

    # Rank 0's timeline (wall clock), for the benchmark's "submit -> first step" breakdown.
    timeline = {"worker_started_at": time.time()}
    config = TrainConfig.from_dict(config_dict)
    rank = ray.train.get_context().get_world_rank()
    with progress.StepWatchdog(config.step_timeout_s, board=config_dict.get(BOARD_KEY), process_id=rank) as watchdog:
        _train(config, rank, watchdog, timeline)


def _train(config: TrainConfig, rank: int, watchdog: progress.StepWatchdog, timeline: dict[str, float]) -> None:
    import jax
    import ray.train

    context = ray.train.get_context()
    local_batch = config.global_batch // context.get_world_size()
    batches = iter(
        ray.train.get_dataset_shard("train").iter_batches(batch_size=local_batch, batch_format="numpy", drop_last=True, prefetch_batches=2)
    )
    # Starting Ray Data's pipeline takes seconds (coordinator, tasks, workers): overlap it with
    # building the model instead of waiting for it at the first step.
    pool = ThreadPoolExecutor(1)
    try:
        first_batch = pool.submit(next, batches, None)
        state = ShardedState(config)
        timeline["state_built_at"] = time.time()
        first = first_batch.result(timeout=DATA_TIMEOUT_S)  # bounded; raises TimeoutError
    finally:
        pool.shutdown(wait=False)  # never block on a stuck pipeline here
    # Logged, not printed: Ray Train's print patch would send each line to stdout and stderr.
    say = logging.getLogger("jobs.train").info if rank == 0 else (lambda *a, **k: None)
    watchdog.beat("model built, first batch in")

    start_step = 0
    found = checkpoints.newest_whole(checkpoints.stored_candidates(config.storage_path, config.run_name), log=say)
    if found:
        meta, arrays, where = found
        start_step = state.restore(meta, arrays, where)
        say(f"[train] resumed from the checkpoint at step {start_step} ({where})")
        watchdog.beat("restored")

    if start_step >= config.steps:
        say(f"[train] the checkpoint is already at step {start_step}; nothing to do")
        ray.train.report({"step": start_step, "start_step": start_step, "already_done": True})
        return

    tokens_per_step = config.global_batch * state.cfg.seq_len
    model_flops = flops_per_token(state.cfg) * tokens_per_step
    losses: list[float] = []
    times: list[float] = []
    first_step_at = 0.0
    stream = itertools.chain([first] if first is not None else [], batches)
    for step, batch in zip(range(start_step, config.steps), stream, strict=False):  # the stream may end first
        tokens = state.batch(batch["tokens"])
        if step == start_step:
            first_step_at = time.time()
        begin = time.perf_counter()
        losses.append(state.step(tokens))
        times.append(time.perf_counter() - begin)
        if step == start_step:
            first_step_at = _latest_over_processes(first_step_at)
        watchdog.beat(step + 1)
        say(f"[train] step {step + 1}/{config.steps} loss {losses[-1]:.4f} ({times[-1] * 1e3:.0f} ms)")

        done = step + 1 == config.steps
        if (step + 1) % config.checkpoint_every == 0 or done:
            steady = times[1:] or times
            step_time = statistics.median(steady)
            flops = model_flops / step_time
            metrics = StepMetrics(
                step=step + 1,
                start_step=start_step,
                loss=losses[-1],
                first_loss=losses[0],
                step_time_s=step_time,
                compile_s=times[0],
                tokens_per_s=tokens_per_step / step_time,
                flops_per_s=flops,
                mfu=mfu(flops, config.peak_flops, state.platform),
                platform=state.platform,
                devices=jax.device_count(),
                processes=jax.process_count(),
                params=param_count(state.cfg),
                first_step_at=first_step_at,
                worker_started_at=timeline["worker_started_at"],
                state_built_at=timeline.get("state_built_at", 0.0),
                matmul_flops_per_s=state.dense_matmul_flops(config.matmul_baseline) if done and config.matmul_baseline else None,
            )
            with tempfile.TemporaryDirectory(prefix="jobs-train-") as directory:
                state.save(Path(directory), step + 1, is_writer=rank == 0)
                # Only rank 0 hands over the checkpoint; every rank reports (it is a barrier). The
                # directory is named by step (rank 0's name wins), so older ones can be found.
                chosen = ray.train.Checkpoint.from_directory(directory) if rank == 0 else None
                ray.train.report(asdict(metrics), checkpoint=chosen, checkpoint_dir_name=checkpoints.dir_name(step + 1))
            watchdog.beat(f"checkpoint at step {step + 1}")
