"""The SPMD training loop each Ray Train worker runs (one per host; `jax.distributed` is set up by
Ray Train's JAX backend): Ray Data batches in, an Orbax checkpoint and `StepMetrics` out every N steps,
and a `StepWatchdog` that turns a hang into an exit the driver reads as one."""

from __future__ import annotations

import itertools
import logging
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from typing import Any

from jobs.runtime import compile_cache, ledger, progress, storage
from jobs.train import checkpoints, elastic, notice, xla_flags
from jobs.train.board import Board, ProfileWindow, parse_steps
from jobs.train.config import StepMetrics, TrainConfig, mfu
from jobs.train.data import synthetic_batches
from jobs.train.model import flops_per_token, init_params, make_schedule, param_count
from jobs.train.state import ShardedState
from jobs.train.text import DataError

# Bound on waiting for the first batch from Ray Data.
DATA_TIMEOUT_S = 600.0
# Bound on waiting for the step's compilation (minutes for a big model on a real slice).
COMPILE_TIMEOUT_S = 3600.0
# Where the attempt's ProgressBoard handle travels in `train_loop_config` (not a TrainConfig field:
# an actor handle, not a number).
BOARD_KEY = "progress_board"
# ...and the run's goodput ledger writer (jobs.runtime.ledger) and the attempt's number.
LEDGER_KEY = "goodput_ledger"
ATTEMPT_KEY = "attempt"


def _first_step_over_processes(entered: float, done: float, cache_hits: int) -> tuple[float, float, int]:
    """The latest of every process's wall time entering and finishing its first step, and how many
    processes found their step's executable in the persistent cache (a collective). JAX keeps
    32-bit numbers, too coarse for a Unix time, so each process sends its milliseconds as two
    20-bit halves."""
    import numpy as np
    from jax.experimental import multihost_utils

    def halves(wall_time: float) -> list[int]:
        ms = int(wall_time * 1000)
        return [ms >> 20, ms & 0xFFFFF]

    mine = np.array([*halves(entered), *halves(done), 1 if cache_hits else 0], np.int32)
    rows = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 5)

    def latest(column: int) -> float:
        return float(max((int(row[column]) << 20) + int(row[column + 1]) for row in rows)) / 1000

    return latest(0), latest(2), int(rows[:, 4].sum())


def train_loop_per_worker(config_dict: dict[str, Any]) -> dict[str, Any] | None:
    """The SPMD program every Ray Train worker runs (one per host; jax.distributed is set up). Returns
    why it stopped early (a preemption notice, an elastic resize), which rank 0's return value
    carries to the driver (`Result.return_value`), else None."""
    import ray.train

    # Rank 0's timeline (wall clock), for the benchmark's "submit -> first step" breakdown.
    timeline = {"worker_started_at": time.time()}
    config = TrainConfig.from_dict(config_dict)
    if config.xla_flags:  # before JAX starts its backend: XLA and libtpu read their flags once
        platform = os.environ.get("JAX_PLATFORMS", "").split(",")[0]  # Ray Train's JAX backend sets it (tpu, cuda)
        xla_flags.apply(os.environ, platform, config.generation)
    compile_cache.enable(config.compilation_cache)  # before anything compiles in this process
    rank = ray.train.get_context().get_world_rank()
    attempt = int(config_dict.get(ATTEMPT_KEY, 1))
    handle = config_dict.get(LEDGER_KEY) if rank == 0 else None  # one voice per run: rank 0's

    def note(event: str, **fields: Any) -> None:
        ledger.record(handle, event, attempt=attempt, **fields)

    note("workers_started")
    with progress.StepWatchdog(config.step_timeout_s, board=config_dict.get(BOARD_KEY), process_id=rank) as watchdog:
        return _train(config, rank, watchdog, timeline, note)


def _train(config: TrainConfig, rank: int, watchdog: progress.StepWatchdog, timeline: dict[str, float], note: Any) -> dict[str, Any] | None:
    import jax
    import ray.train
    from ray.train import collective

    cache_events = compile_cache.CacheEvents()
    context = ray.train.get_context()
    local_batch = config.global_batch // context.get_world_size()
    # Real text comes through Ray Data; synthetic tokens are made right here, from the step and
    # rank (no pipeline to start: seconds saved on every start, and a rerun continues the stream).
    batches = _epochs(ray.train.get_dataset_shard("train"), local_batch, config.data) if config.data else None
    # Starting Ray Data's pipeline takes seconds (coordinator, tasks, workers): overlap it with
    # building the model instead of waiting for it at the first step.
    pool = ThreadPoolExecutor(2)
    try:
        first_batch = pool.submit(next, batches, None) if batches is not None else None
        state = ShardedState(config, initialize=False)  # parameters: a checkpoint's, else an import's or random
        timeline["state_built_at"] = time.time()
        note("state_built")
        # Compile the step while the parameters are restored, imported or made: its executable
        # depends on their shapes alone, and on a big model both take minutes.
        compiling = pool.submit(_compile_counted, state, cache_events)
        first = None
        if first_batch is not None:
            waited = time.perf_counter()
            first = first_batch.result(timeout=DATA_TIMEOUT_S)  # bounded; raises TimeoutError
            note("data_wait", seconds=time.perf_counter() - waited)
    finally:
        pool.shutdown(wait=False)  # never block on a stuck pipeline here
    # Logged, not printed: Ray Train's print patch would send each line to stdout and stderr.
    say = logging.getLogger("jobs.train").info if rank == 0 else (lambda *a, **k: None)
    watchdog.beat("model built, first batch in")

    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax narrates every save at INFO
    root = checkpoints.run_root(config.storage_path, config.run_name)
    manager = checkpoints.open_manager(root)
    abstract_params, abstract_opt_state = state.abstract()
    begin = time.perf_counter()
    found = checkpoints.restore_newest(
        manager, state.cfg.to_dict(), abstract_params, abstract_opt_state, log=say, agree=checkpoints.all_processes_agree
    )
    start_step = 0
    if found:
        state.load(found.params, found.opt_state)  # restored into the abstract shapes: nothing random was built
        start_step = found.step
        say(f"[train] resumed from the checkpoint at step {start_step} ({found.where})")
        note("restored", step=start_step, seconds=time.perf_counter() - begin)
        watchdog.beat("restored")
    elif config.init_from:  # only a run without a checkpoint imports: a rerun resumes what it trained
        from jobs.train import hf_import

        say(f"[train] importing {config.init_from} ({hf_import.cache_note(config.init_from)})")
        stats = hf_import.ImportStats()
        state.start_from(hf_import.import_checkpoint(config.init_from, state.cfg, state.param_sharding, stats))
        say(f"[train] imported {stats.bytes_read / 2**20:,.1f} MiB onto this host's devices in {stats.seconds:.1f} s")
        note("initialized", how="import", seconds=time.perf_counter() - begin)
        watchdog.beat("imported")
    else:
        state.start_from(init_params(state.cfg, config.seed))
        note("initialized", how="random", seconds=time.perf_counter() - begin)

    waited = time.perf_counter()
    compile_s, lower_s, cache_hits, cache_misses = compiling.result(timeout=COMPILE_TIMEOUT_S)  # bounded; raises TimeoutError
    note(
        "compiled",
        seconds=compile_s,
        lower_s=lower_s,
        wait_s=time.perf_counter() - waited,
        cache_hits=cache_hits,
        cache_misses=cache_misses,
    )
    watchdog.beat("compiled")

    # A run keeps its tokenizer when it starts; a resumed one already has it, and must not need
    # the path it came from (an --init-from directory's, possibly gone by the rerun).
    if rank == 0 and config.tokenizer and not (found and storage.exists(storage.join(root, checkpoints.TOKENIZER_FILE))):
        checkpoints.keep_tokenizer(root, config.tokenizer)
    if start_step >= config.steps:
        say(f"[train] the checkpoint is already at step {start_step}; nothing to do")
        ray.train.report({"step": start_step, "start_step": start_step, "already_done": True})
        manager.close()
        return None

    # What the checkpoint's meta records: the tokenizer (for jobs.export) and the model it was
    # initialized from; a resumed run keeps its first run's note.
    notes = {"tokenizer": config.tokenizer}
    init_from = found.meta.get("init_from", "") if found else config.init_from
    if init_from:
        notes["init_from"] = init_from
    tokens_per_step = config.global_batch * state.cfg.seq_len
    model_flops = flops_per_token(state.cfg) * tokens_per_step
    board = Board(root, enabled=rank == 0)  # each attempt its own event file, beside the earlier ones
    schedule = make_schedule(config.learning_rate, config.warmup_steps, config.steps)
    profile = ProfileWindow(parse_steps(config.profile_steps) if config.profile_steps else None, root, jax.process_index())
    losses: list[float] = []
    times: list[float] = []
    first_step_at = first_step_done_at = 0.0
    hit_hosts = 0  # hosts whose step came from the persistent cache
    stalls: list[float] = []
    saved: int | None = None  # the newest step whose save has started
    committed_step: int | None = start_step or None  # the newest step known committed
    timer = notice.SaveTimer()  # how long saves take, for a notice's decision
    grow = _GrowthCheck(config, rank)
    if batches is None:
        stream: Iterator[dict[str, Any]] = synthetic_batches(
            start_step, config.global_batch, rank, local_batch, state.cfg.seq_len, state.cfg.vocab
        )
    else:
        stream = itertools.chain([first] if first is not None else [], batches)
    stop: dict[str, Any] | None = None  # why the loop stopped early, for the driver
    for step in range(start_step, config.steps):
        waited = time.perf_counter()
        batch = next(stream, None)  # _epochs never ends; a stream that does ends the run early
        if batch is None:
            break
        data_s = time.perf_counter() - waited
        tokens = state.batch(batch["tokens"])
        if step == start_step:
            first_step_at = time.time()
        profile.before(step + 1)
        begin = time.perf_counter()
        with jax.profiler.StepTraceAnnotation("train_step", step_num=step + 1):  # names the step in a trace
            losses.append(state.step(tokens))
        times.append(time.perf_counter() - begin)
        if (traced := profile.after(step + 1)) is not None:
            say(f"[train] profile of steps {config.profile_steps} written to {traced}")
        step_flops = model_flops / times[-1]
        board.scalars(
            step + 1,
            {
                "train/loss": losses[-1],
                "train/learning_rate": float(schedule(step)),
                "train/grad_norm": state.grad_norm,
                "train/step_time_s": times[-1],
                "train/tokens_per_s": tokens_per_step / times[-1],
                "train/mfu": mfu(step_flops, config.peak_flops, state.platform),
            },
        )
        once: dict[str, int] = {}
        if step == start_step:  # every host's, once: when the slice was training, and which hosts compiled
            first_step_at, first_step_done_at, hit_hosts = _first_step_over_processes(first_step_at, time.time(), cache_hits)
            once = {"hit_hosts": hit_hosts, "hosts": jax.process_count()}
        note("step", step=step + 1, seconds=times[-1], data_s=data_s, loss=losses[-1], **once)
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
                first_step_done_at=first_step_done_at,
                worker_started_at=timeline["worker_started_at"],
                state_built_at=timeline.get("state_built_at", 0.0),
                matmul_flops_per_s=state.dense_matmul_flops(config.matmul_baseline) if done and config.matmul_baseline else None,
                cache_hits=cache_hits,
                hit_hosts=hit_hosts,
            )
            committed = saved  # save() below waits for the previous save: that one is then committed
            begin = time.perf_counter()
            checkpoints.save(manager, step + 1, state.params, state.opt_state, state.cfg.to_dict(), **notes)
            timer.started()
            committed_step, saved = committed or committed_step, step + 1
            stalls.append(time.perf_counter() - begin)  # what the loop waits for; the writing goes on
            note("save", step=step + 1, stall_s=stalls[-1])
            if done:
                manager.wait_until_finished()
                committed = saved
            metrics = replace(metrics, checkpoint_step=committed, checkpoint_stall_s=statistics.median(stalls))
            # Ray Train registers each checkpoint once Orbax has committed it: a pointer into the run's
            # directory, nothing to upload (every host wrote its own shards). Every rank reports
            # (it is a barrier); rank 0's pointer is the one registered.
            ray.train.report(
                asdict(metrics),
                checkpoint=_pointer(committed) if rank == 0 and committed is not None else None,
                checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD,
            )
            watchdog.beat(f"checkpoint at step {step + 1}")
            if done:
                break
        in_progress = manager.is_saving_in_progress()
        timer.poll(in_progress)
        committed_step = saved if saved is not None and not in_progress else committed_step
        # A preemption notice, or (elastic, on fewer slices) whole idle slices to grow onto: save
        # this step, tell the driver, and end the attempt here (every rank learns it at this step).
        info = ray.train.get_preemption_info()  # a barrier: every rank gets the same answer
        stop = None
        if info is not None:
            left = notice.remaining_s(info.deadline_ms, time.time())
            plan = collective.broadcast_from_rank_zero(
                notice.plan_on_notice(step + 1, left, timer.longest_s, committed_step, saved if in_progress else None)
            )
            say(f"[train] preemption notice at step {step + 1} ({'no deadline' if left is None else f'{left:.1f} s left'}): {plan.why}")
            note("notice", step=step + 1, remaining_s=left, save=plan.save, why=plan.why)
            stop = {"preempted": True, "saved_step": None, "why": plan.why}
            if plan.save:
                stop["saved_step"] = _save_now(manager, step + 1, saved, state, notes, timer, note)
                saved = committed_step = step + 1
        elif (growth := grow.check(step + 1)) is not None and growth.grow:
            say(f"[train] {growth.why}: saving step {step + 1} and restarting on {growth.slices} slices")
            note("resize", step=step + 1, slices=growth.slices, why=growth.why)
            _save_now(manager, step + 1, saved, state, notes, timer, note)
            saved = committed_step = step + 1
            stop = {"resized": True, "slices": growth.slices, "why": growth.why}
        if stop is not None:
            stop = {"step": step + 1, "start_step": start_step, **stop}
            if saved == committed_step == step + 1:  # Ray Train registers the checkpoint saved here
                ray.train.report(
                    stop,
                    checkpoint=_pointer(step + 1) if rank == 0 else None,
                    checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD,
                )
            break
    manager.wait_until_finished()  # a stream that ended early leaves its last save in flight
    manager.close()
    board.close()
    cache_events.close()
    return stop


def _save_now(manager: Any, step: int, saved: int | None, state: ShardedState, notes: dict[str, str], timer: Any, note: Any) -> int:
    """Save `step` (unless its save is already under way) and wait for its commit; the step."""
    begin = time.perf_counter()
    if saved != step:
        checkpoints.save(manager, step, state.params, state.opt_state, state.cfg.to_dict(), **notes)
    manager.wait_until_finished()
    seconds = time.perf_counter() - begin
    timer.measured(seconds)
    note("save", step=step, stall_s=seconds)
    note("saved_now", step=step, seconds=seconds)
    return step


class _GrowthCheck:
    """Whether an elastic run on fewer than its slices can grow (every rank calls `check` at every
    step boundary while shrunk: a collective; rank 0 looks at the cluster every `resize_check_s`)."""

    def __init__(self, config: TrainConfig, rank: int) -> None:
        self.config = config
        self.rank = rank
        self.running = config.attempt_slices or config.slices
        self.last = time.monotonic()

    def check(self, step: int) -> elastic.GrowPlan | None:
        if self.running >= self.config.slices:
            return None
        plan = None
        if self.rank == 0 and time.monotonic() - self.last >= self.config.resize_check_s:
            from infra import catalog
            from jobs.runtime.inventory import cluster_inventory

            self.last = time.monotonic()
            model = catalog.shape_for_pod_type(self.config.pod_type)
            idle = sum(1 for s in cluster_inventory(model)[0] if s.idle)
            plan = elastic.plan_growth(self.running, self.config.slices, self.config.min_slices, idle)
        from ray.train import collective

        return collective.broadcast_from_rank_zero(plan)


def _compile_counted(state: ShardedState, events: compile_cache.CacheEvents) -> tuple[float, float, int, int]:
    """Compile the step on this thread: (seconds in all, of them lowering, persistent-cache hits,
    misses) of the step's own compile, not of a restore's compiles on the thread beside it."""
    hits, misses = events.of_thread()
    lower_s, compile_s = state.compile_step()
    after = events.of_thread()
    return lower_s + compile_s, lower_s, after[0] - hits, after[1] - misses


def _epochs(shard: Any, batch_size: int, data: str) -> Iterator[dict[str, Any]]:
    """The shard's batches, epoch after epoch: a corpus smaller than --steps x --batch-size is read
    again (synthetic data is sized to the run)."""
    while True:
        empty = True
        for batch in shard.iter_batches(batch_size=batch_size, batch_format="numpy", drop_last=True, prefetch_batches=2):
            empty = False
            yield batch
        if empty:
            raise DataError(f"{data or 'the synthetic data'} gives no full batch of {batch_size} rows of tokens to this host")


def _pointer(step: int):
    """Ray Train's handle on the committed checkpoint at `step`, in the run's directory."""
    import ray.train

    storage = ray.train.get_context().get_storage()
    return ray.train.Checkpoint(path=f"{storage.experiment_fs_path}/{checkpoints.dir_name(step)}", filesystem=storage.storage_filesystem)
