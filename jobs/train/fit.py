"""One Ray Train `fit()` per attempt on whole slices, rerun from the newest checkpoint after a lost
host or a hang (`run_training`); the driver side of `python -m jobs.train`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from infra import disruption
from jobs import cli
from jobs.runtime import goodput, ledger, progress, storage
from jobs.runtime.inventory import cluster_inventory, wait_for_slices
from jobs.runtime.outcomes import Failed, NoProgressError, Outcome, Preempted, Resized, Succeeded, classify
from jobs.runtime.reruns import DEFAULT_RETRY_BUDGET, Attempt, RetryBudget, RunReport, attempt_outcome, retry, watched_hosts
from jobs.train import checkpoints, elastic
from jobs.train.board import Board
from jobs.train.config import AlreadyTrained, StepMetrics, TrainConfig, TrainResult
from jobs.train.model import ModelConfig
from jobs.train.worker import ATTEMPT_KEY, BOARD_KEY, LEDGER_KEY, train_loop_per_worker

DRIVER_STARTED_AT = time.time()  # for the benchmark's timeline: when the driver imported this
# Variables the workers need from the job's environment: on the simulation they select JAX's CPU
# branch of Ray Train's JAX backend and one CPU device per chip.
PASSTHROUGH_ENV = ("JAX_PLATFORMS", "XLA_FLAGS")


def run_training(
    target: cli.SliceTarget,
    config: TrainConfig,
    name: str,
    storage_path: str,
    budget: RetryBudget = DEFAULT_RETRY_BUDGET,
    log: Callable[[str], None] = print,
) -> RunReport:
    """Train, rerunning on whole slices after a lost host within `budget`; the report's value is the
    `TrainResult` when an attempt succeeded. Raises `AlreadyTrained`. Needs `ray.init()` done.

    Each attempt is one Ray Train `fit()`, which reserves the slices itself and resumes from the
    newest whole checkpoint. Ray Train retries nothing itself (`FailureConfig` of zeros): it cannot
    tell a host lost without a preemption notice, or a hang, from a bug in the training function, and
    retries all three from one budget. Its error comes back here instead, to `outcomes.classify`
    and `reruns.decide`, as for every other job: lost hosts and hangs under `--max-preemptions`,
    crashes under `--max-failures`, user errors never.
    """
    import ray

    config = replace(config, storage_path=storage_path, run_name=name)  # where the workers resume from
    run_dir = checkpoints.run_root(storage_path, name)
    book = ledger.Ledger.open(run_dir)  # every attempt's events, for the run's goodput

    def attempt_once(number: int) -> Attempt:
        started = time.monotonic()
        booked = book.attempt(number)
        slices = attempt_slices(target, config)
        book.record("attempt_start", attempt=booked, slices=slices, hosts=slices * target.shape.hosts)
        on = replace(target, slices=slices)
        # Every host of the shape, not only those Ray Train will pick: the GCS may take seconds to
        # mark a killed host dead, and it must still count as this attempt's when it does.
        hosts = watched_hosts(ray.nodes(), target.shape)
        board = progress.start_board(target.hosts) if config.step_timeout_s else None
        outcome: Any = None
        try:
            outcome = attempt_outcome(
                lambda: _fit(on, replace(config, attempt_slices=slices), board, book, booked), hosts, passthrough=(AlreadyTrained,)
            )
            stalls = _stalls(board, config.step_timeout_s) if isinstance(outcome, Failed) and not outcome.user_error else {}
            if stalls:  # a watchdog stopped its worker: a hang, not the crash its exit looks like
                ranks = [f"Ray Train rank {r}" for r in range(target.hosts)]
                outcome = classify(NoProgressError(progress.describe_silence(stalls, config.step_timeout_s, ranks)))
        finally:
            book.record("attempt_end", attempt=booked, outcome=getattr(outcome, "kind", "already-trained"))
            if board is not None:
                progress.stop_board(board)
        return Attempt(number, outcome, (), None, time.monotonic() - started)

    try:
        report = retry(attempt_once, budget, f"train {name}", log)
    finally:
        book.close()
    if report.ok:
        report = replace(report, outcome=Succeeded(_with_goodput(report.value, run_dir, log)))
    return report


def attempt_slices(target: cli.SliceTarget, config: TrainConfig) -> int:
    """How many whole slices the next attempt takes: all of them, or (elastic) the most that are idle
    now, at least --min-slices (the attempt then waits, bounded, for those)."""
    if config.min_slices in (0, config.slices):
        return target.slices
    idle = sum(1 for s in cluster_inventory(target.shape)[0] if s.idle)
    return elastic.pick(config.slices, config.min_slices, idle) or config.min_slices


def _with_goodput(result: TrainResult, run_dir: str, log: Callable[[str], None]) -> TrainResult:
    """`result` with the ledger's account of the run (unchanged, and a warning, if it cannot be read)."""
    uri = ledger.ledger_uri(run_dir)
    try:
        account = goodput.account(ledger.read_events(uri))
    except (storage.StorageError, goodput.LedgerError) as err:
        log(f"train: no goodput figures: {err}")
        return result
    board = Board(run_dir, suffix=".goodput")  # beside the workers' scalars: `tensorboard --logdir <run>/tensorboard`
    board.scalars(account.last_step, {"run/goodput": account.goodput})
    board.close()
    return replace(result, goodput=account.as_dict(), goodput_summary=account.describe())


def _stalls(board: Any, timeout_s: float) -> dict[int, tuple[float, Any]]:
    """The ranks a watchdog reported stalled, else those the board saw fall silent past the step
    timeout after a first step (a watchdog's report can be lost as it exits its worker)."""
    import ray

    if board is None:
        return {}
    try:
        reports, silence = ray.get([board.stall_reports.remote(), board.silence.remote()], timeout=progress.STALL_REPORT_S)
    except Exception:  # the board went with its node: no reports to read
        return {}
    return reports or progress.silent_since_progress(silence, timeout_s)


def ray_train_configs(target: cli.SliceTarget, name: str, storage_path: str) -> tuple[Any, Any]:
    """Ray Train's ScalingConfig and RunConfig of a run: one worker per host of whole slices, no
    retries inside Ray Train (also what bench/noop_trainer.py, the start-up floor, runs with)."""
    # Ray Train v2's configs, which JaxTrainer takes (what `ray.train` re-exports unless RAY_TRAIN_V2_ENABLED=0).
    from ray.train.v2.api.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    shape = target.shape
    scaling = ScalingConfig(
        use_tpu=True,
        num_workers=target.hosts,
        topology=shape.topology,
        accelerator_type=shape.generation.ray_accelerator_type,
        placement_strategy="SPREAD",
    )
    run_config = RunConfig(
        name=name,
        storage_path=storage_path,
        # Orbax deletes old checkpoints (jobs.train.checkpoints.KEEP); Ray Train only registers them.
        checkpoint_config=CheckpointConfig(num_to_keep=None),
        # No retries inside Ray Train (run_training decides them), and a start that times out is an
        # error, not a retry forever.
        failure_config=FailureConfig(max_failures=0, max_preemption_failures=0, controller_failure_limit=0),
        worker_runtime_env={"env_vars": {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}},
    )
    return scaling, run_config


def _fit(target: cli.SliceTarget, config: TrainConfig, board: Any, book: ledger.Ledger, attempt: int) -> TrainResult | Outcome:
    """One Ray Train run of `config.run_name` in `config.storage_path`: wait (bounded) for whole idle
    slices, fit, return the summary (or the attempt's outcome when the workers stopped it early: a
    preemption notice, an elastic resize)."""
    from ray.train.v2.jax import JaxTrainer

    from jobs.train.text import text_dataset

    name, storage_path = config.run_name, config.storage_path
    shape = target.shape
    timeout = target.reserve_timeout_s or cli.DEFAULT_RESERVE_TIMEOUT_S
    started = time.monotonic()
    # Ray Train reserves the slices itself; wait for them here first, bounded, so that a missing
    # host gives our error (which hosts are there) rather than an endless rescheduling loop...
    wait_for_slices(shape, target.slices, timeout)
    book.record("reserved", attempt=attempt)
    # ...and bound Ray Train's own wait by what is left (the controller reads this variable), and
    # let its preemption watcher poll the GCS's drains, and its controller its workers, every second
    # (not every 5 and 2: infra.disruption).
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(max(30.0, timeout - (time.monotonic() - started)))
    os.environ["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] = str(disruption.PREEMPTION_POLL_S)
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(disruption.RAY_TRAIN_HEALTH_CHECK_S)

    scaling, run_config = ray_train_configs(target, name, storage_path)
    cfg = ModelConfig(**config.model)
    # Real text through Ray Data; synthetic tokens are made on the workers (jobs.train.data).
    datasets = {"train": text_dataset(config.data, config.tokenizer, cfg.seq_len)} if config.data else None
    trainer = JaxTrainer(
        train_loop_per_worker,
        train_loop_config={**asdict(config), BOARD_KEY: board, LEDGER_KEY: book.handle, ATTEMPT_KEY: attempt},
        scaling_config=scaling,
        run_config=run_config,
        datasets=datasets,
    )
    fit_started_at = time.time()
    try:
        result = trainer.fit()
    except BaseException:
        book.record("fit_failed", attempt=attempt)  # when Ray Train gave up: the lost host noticed
        raise
    returned = getattr(result, "return_value", None)  # rank 0's: why it stopped early (Ray Train v2's Result)
    stopped = returned if isinstance(returned, dict) else {}
    if stopped.get("preempted"):  # the workers saved on a notice (or could not) and stopped
        return Preempted(f"preemption notice at step {stopped['step']}: {stopped['why']}", stopped.get("saved_step"))
    if stopped.get("resized"):
        return Resized(f"saved at step {stopped['step']}: {stopped['why']}", int(stopped["slices"]))
    reported = result.metrics or {}
    if reported.get("already_done"):
        raise AlreadyTrained(f"run {name!r} is already at step {reported['step']} (>= --steps); pass more --steps or another --name")
    if not reported:
        raise RuntimeError("training reported no metrics")
    m = StepMetrics.from_dict(reported)
    return TrainResult(
        run=name,
        storage_path=storage_path,
        target=target.describe(),
        params=m.params,
        start_step=m.start_step,
        steps=m.step,
        first_loss=m.first_loss,
        final_loss=m.loss,
        step_time_s=m.step_time_s,
        compile_s=m.compile_s,
        tokens_per_s=m.tokens_per_s,
        flops_per_s=m.flops_per_s,
        mfu=m.mfu,
        platform=m.platform,
        devices=m.devices,
        processes=m.processes,
        first_step_at=m.first_step_at,
        driver_started_at=DRIVER_STARTED_AT,
        fit_started_at=fit_started_at,
        worker_started_at=m.worker_started_at,
        state_built_at=m.state_built_at,
        matmul_flops_per_s=m.matmul_flops_per_s,
        checkpoint=result.checkpoint.path if result.checkpoint else None,
        checkpoint_stall_s=m.checkpoint_stall_s,
        cache_hits=m.cache_hits,
        first_step_done_at=m.first_step_done_at,
        hit_hosts=m.hit_hosts,
    )
