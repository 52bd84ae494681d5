"""Train a small decoder-only transformer LM on whole TPU slices, the way Ray recommends for TPUs.

    python -m jobs.train --generation v6e --topology 4x4 [--steps N] [--storage DIR|gs://...] [--name RUN]

Ray Train's `JaxTrainer` with `ScalingConfig(use_tpu=True, topology, accelerator_type, num_workers =
hosts x slices)` reserves the slices itself (one worker per host) and initializes `jax.distributed`;
Ray Data feeds each worker its shard of synthetic token rows (`get_dataset_shard`). The batch is
split over a (data, fsdp) mesh of every chip; parameters and optimizer state are sharded over the
fsdp axis (the chips of one host by default) and replicated over data.

Checkpoints go through `ray.train.report(checkpoint=...)` to `RunConfig(storage_path=...)`: the
simulation's shared directory (`JOBS_STORAGE_PATH`, set by `jobs.local`) or else the environment
config's `gs://` bucket. Rerunning with the same `--name` resumes from the newest whole checkpoint
(`jobs.checkpoints`: one cut short is skipped).

A lost host, a hang (`--step-timeout`) or a crash ends the Ray Train run; `run_training` reruns it on
a whole slice from the newest checkpoint within `--max-preemptions` / `--max-failures`, as
`jobs.driver` does for every job. A user error is not rerun.

Reports step time, tokens/s, achieved FLOP/s and, on TPU, MFU against the catalog's peak; prints a
summary and one `TRAIN {json}` line. Exit status: 0 done, 1 failed (or no slice in time), 2 bad flags,
130 cancelled.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Sequence

from jobs import checkpoints, cli, progress
from jobs.driver import Attempt, RetryBudget, RunReport, classify_failure, print_attempts, report_failure, retry, watched_hosts
from jobs.model import ModelConfig, flops_per_token, param_count
from jobs.outcomes import Cancelled, NoProgressError, Outcome, Succeeded, classify
from jobs.slices import SliceUnavailableError, wait_for_slices

DRIVER_STARTED_AT = time.time()  # for the benchmark's timeline: when this module was imported
STORAGE_ENV = "JOBS_STORAGE_PATH"
# Variables the workers need from the job's environment: on the simulation they select JAX's CPU
# branch of Ray Train's JAX backend and one CPU device per chip.
PASSTHROUGH_ENV = ("JAX_PLATFORMS", "XLA_FLAGS")
# Bound on waiting for the first batch from Ray Data.
DATA_TIMEOUT_S = 600.0
# A step (or a batch, or a checkpoint) that takes this long is a hang. The first step includes
# starting Ray Data and compiling, which on a big model takes minutes: leave room for it.
DEFAULT_STEP_TIMEOUT_S = 1800.0
# Where the attempt's ProgressBoard handle travels in `train_loop_config` (not a TrainConfig field:
# an actor handle, not a number).
BOARD_KEY = "progress_board"


@dataclass(frozen=True)
class TrainConfig:
    """Everything a worker needs (sent as `train_loop_config`)."""

    model: dict[str, int]
    steps: int
    global_batch: int
    learning_rate: float
    warmup_steps: int
    checkpoint_every: int
    fsdp: int  # 0: the chips of one host
    seed: int
    peak_flops: float  # the slices' bf16 peak, for MFU on TPU
    matmul_baseline: int  # >0: also time a dense matmul of this size per device, for the benchmark
    step_timeout_s: float = 0.0  # >0: a worker silent this long reports a stall and exits
    storage_path: str = ""  # where the run's checkpoints are (RunConfig's storage_path/name)...
    run_name: str = ""  # ...listed to resume from the newest whole one

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


class AlreadyTrained(Exception):
    """The run's newest checkpoint is at or past --steps."""


@dataclass(frozen=True)
class TrainResult:
    run: str
    storage_path: str
    target: str
    params: int
    start_step: int  # 0 for a fresh run, the checkpoint's step when resumed
    steps: int
    first_loss: float  # of this run's first step
    final_loss: float
    step_time_s: float  # median, compile step excluded
    compile_s: float  # the first step of this run, compilation included
    tokens_per_s: float
    flops_per_s: float
    mfu: float | None  # on TPU only
    platform: str
    devices: int
    processes: int
    first_step_at: float  # wall clock when the last host entered its first step
    driver_started_at: float  # wall clock when the job's driver (this module) began
    fit_started_at: float  # ...and when it called JaxTrainer.fit()
    worker_started_at: float  # wall clock when rank 0's training function began
    state_built_at: float  # ...and when its model and optimizer were ready (sharded)
    matmul_flops_per_s: float | None
    checkpoint: str | None

    def summary(self) -> str:
        mfu = f"{self.mfu:.1%}" if self.mfu is not None else f"n/a on {self.platform}"
        resumed = f"resumed at step {self.start_step}, " if self.start_step else ""
        return "\n".join(
            [
                f"train {self.run}: {self.target}",
                f"  {resumed}steps {self.start_step}->{self.steps}, loss {self.first_loss:.3f} -> {self.final_loss:.3f}",
                f"  {self.params:,} parameters on {self.devices} {self.platform} devices in {self.processes} processes",
                f"  step {self.step_time_s * 1e3:.1f} ms (first step {self.compile_s:.1f} s with compilation), "
                f"{self.tokens_per_s:,.0f} tokens/s, {self.flops_per_s / 1e9:.2f} GFLOP/s, MFU {mfu}",
                f"  checkpoint: {self.checkpoint}",
            ]
        )


def mfu(flops_per_s: float, peak_flops: float, platform: str) -> float | None:
    """Model FLOP/s over the slices' peak; only meaningful on TPU (pure)."""
    return flops_per_s / peak_flops if platform == "tpu" and peak_flops > 0 else None


# --- on each worker ----------------------------------------------------------------------------


class _State:
    """The sharded model, optimizer and compiled step of one worker."""

    def __init__(self, config: TrainConfig):
        import jax
        import jax.numpy as jnp
        import numpy as np
        import optax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        from jobs.model import DATA_AXIS, FSDP_AXIS, batch_spec, init_params, loss_fn, param_specs

        self.cfg = ModelConfig(**config.model)
        self.platform = jax.devices()[0].platform
        self.compute_dtype = jnp.bfloat16 if self.platform == "tpu" else jnp.float32
        local = jax.local_device_count()
        fsdp = config.fsdp or local
        if local % fsdp or config.global_batch % jax.device_count():
            raise ValueError(
                f"--fsdp {fsdp} must divide the {local} chips of a host and --batch-size {config.global_batch} "
                f"must be a multiple of the {jax.device_count()} chips"
            )
        # Devices in process order, so each process owns whole rows of the mesh and therefore a
        # contiguous block of the batch (what make_array_from_process_local_data expects).
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        self.mesh = Mesh(np.array(devices).reshape(-1, fsdp), (DATA_AXIS, FSDP_AXIS))
        self.batch_sharding = NamedSharding(self.mesh, batch_spec())
        replicated = NamedSharding(self.mesh, P())

        initial = init_params(self.cfg, config.seed)  # numpy, identical on every host
        param_sharding = jax.tree.map(lambda s: NamedSharding(self.mesh, s), param_specs(initial, fsdp))
        self.params = jax.tree.map(_shard, initial, param_sharding)
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), initial)
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, config.learning_rate, max(1, config.warmup_steps), max(config.steps, config.warmup_steps + 1)
        )
        self.optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
        # Optimizer moments take their parameter's sharding; scalars (step counts) are replicated.
        opt_sharding = optax.tree_map_params(
            self.optimizer,
            lambda _, sharding: sharding,
            jax.eval_shape(self.optimizer.init, abstract),
            param_sharding,
            transform_non_params=lambda _: replicated,
        )
        self.opt_state = jax.jit(self.optimizer.init, out_shardings=opt_sharding)(self.params)

        def step(params, opt_state, tokens):
            loss, grads = jax.value_and_grad(loss_fn)(params, tokens, self.cfg, self.compute_dtype)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self._step = jax.jit(
            step,
            in_shardings=(param_sharding, opt_sharding, self.batch_sharding),
            out_shardings=(param_sharding, opt_sharding, replicated),
            donate_argnums=(0, 1),
        )

    def batch(self, local_tokens):
        import jax

        return jax.make_array_from_process_local_data(self.batch_sharding, local_tokens)

    def step(self, tokens) -> float:
        self.params, self.opt_state, loss = self._step(self.params, self.opt_state, tokens)
        return float(loss)  # waits for the step

    # Checkpoints hold full arrays, readable with numpy alone: right for a model this size. A large
    # model would write per-process shards (e.g. Orbax) instead. `jobs.checkpoints` writes them so
    # that a half-written one is never resumed from.
    def save(self, directory: Path, step: int, is_writer: bool) -> None:
        import jax
        from jax.experimental import multihost_utils

        leaves = jax.tree.leaves((self.params, self.opt_state))
        # Parameters are sharded within a host and replicated across hosts, so every process
        # already holds whole arrays: copy them out without a collective (and its compile).
        # Same layout on every process, so all take the same branch.
        copies = [_local_copy(leaf) for leaf in leaves]
        if all(c is not None for c in copies):
            leaves = copies
        else:
            leaves = multihost_utils.process_allgather(leaves, tiled=True)
        if is_writer:
            checkpoints.write(directory, leaves, step, self.cfg.to_dict())

    def restore(self, meta: checkpoints.CheckpointMeta, arrays: Sequence[Any], where: str) -> int:
        import jax

        leaves, tree = jax.tree.flatten((self.params, self.opt_state))
        if meta.model != self.cfg.to_dict() or len(arrays) != len(leaves):
            raise ValueError(
                f"the checkpoint {where} is of another model ({meta.model}, this run: {self.cfg.to_dict()}); "
                "pass another --name to start a new run"
            )
        restored = [_shard(a, leaf.sharding) for leaf, a in zip(leaves, arrays)]
        self.params, self.opt_state = jax.tree.unflatten(tree, restored)
        return meta.step

    def dense_matmul_flops(self, size: int, iters: int = 3) -> float:
        """FLOP/s of a plain [devices x size, size] @ [size, size] on the same mesh, no communication:
        what these devices do at best, the benchmark's yardstick for the training step."""
        import jax
        import jax.numpy as jnp
        import numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P

        n = jax.device_count()
        x = jax.make_array_from_callback(
            (n * size, size), self.batch_sharding, lambda idx: np.ones((size, size), np.float32)
        ).astype(self.compute_dtype)
        w = jax.device_put(jnp.ones((size, size), self.compute_dtype), NamedSharding(self.mesh, P()))
        matmul = jax.jit(lambda a, b: a @ b, out_shardings=self.batch_sharding)
        matmul(x, w).block_until_ready()
        start = time.perf_counter()
        for _ in range(iters):
            matmul(x, w).block_until_ready()
        return 2.0 * n * size**3 * iters / (time.perf_counter() - start)


def _shard(host_array, sharding):
    """A global array from a host array every process holds in full (no compile, no transfer)."""
    import jax

    return jax.make_array_from_callback(host_array.shape, sharding, lambda index: host_array[index])


def _local_copy(array):
    """`array` as one numpy array from this process's shards, or None if they do not cover it."""
    import numpy as np

    out = np.empty(array.shape, array.dtype)
    covered = np.zeros(array.shape, bool)
    for shard in array.addressable_shards:
        out[shard.index] = np.asarray(shard.data)
        covered[shard.index] = True
    return out if covered.all() else None


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
        ray.train.get_dataset_shard("train").iter_batches(
            batch_size=local_batch, batch_format="numpy", drop_last=True, prefetch_batches=2
        )
    )
    # Starting Ray Data's pipeline takes seconds (coordinator, tasks, workers): overlap it with
    # building the model instead of waiting for it at the first step.
    pool = ThreadPoolExecutor(1)
    try:
        first_batch = pool.submit(next, batches, None)
        state = _State(config)
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
    for step, batch in zip(range(start_step, config.steps), stream):
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
            metrics = {
                "step": step + 1,
                "start_step": start_step,
                "loss": losses[-1],
                "first_loss": losses[0],
                "step_time_s": step_time,
                "compile_s": times[0],
                "tokens_per_s": tokens_per_step / step_time,
                "flops_per_s": flops,
                "mfu": mfu(flops, config.peak_flops, state.platform),
                "platform": state.platform,
                "devices": jax.device_count(),
                "processes": jax.process_count(),
                "params": param_count(state.cfg),
                "first_step_at": first_step_at,
                **timeline,
                "matmul_flops_per_s": None,
            }
            if done and config.matmul_baseline:
                metrics["matmul_flops_per_s"] = state.dense_matmul_flops(config.matmul_baseline)
            with tempfile.TemporaryDirectory(prefix="jobs-train-") as directory:
                state.save(Path(directory), step + 1, is_writer=rank == 0)
                # Only rank 0 hands over the checkpoint; every rank reports (it is a barrier). The
                # directory is named by step (rank 0's name wins), so older ones can be found.
                chosen = ray.train.Checkpoint.from_directory(directory) if rank == 0 else None
                ray.train.report(metrics, checkpoint=chosen, checkpoint_dir_name=checkpoints.dir_name(step + 1))
            watchdog.beat(f"checkpoint at step {step + 1}")


# --- driver ------------------------------------------------------------------------------------


def default_storage(target: cli.SliceTarget) -> str | None:
    if os.environ.get(STORAGE_ENV):
        return os.environ[STORAGE_ENV]
    return f"gs://{target.bucket_name}/ray-train" if target.bucket_name else None


def run_training(
    target: cli.SliceTarget,
    config: TrainConfig,
    name: str,
    storage_path: str,
    budget: RetryBudget = RetryBudget(),
    log: Any = print,
) -> RunReport:
    """Train, rerunning on whole slices after a lost host within `budget`; the report's value is the
    `TrainResult` when an attempt succeeded. Raises `AlreadyTrained`. Needs `ray.init()` done.

    Each attempt is one Ray Train `fit()`, which reserves the slices itself and resumes from the
    newest whole checkpoint. Ray Train retries nothing itself (`FailureConfig` of zeros): it cannot
    tell a host lost without a preemption notice, or a hang, from a bug in the training function, and
    retries all three from one budget. Its error comes back here instead, to `jobs.outcomes.classify`
    and `jobs.driver.decide`, as for every other job: lost hosts and hangs under `--max-preemptions`,
    crashes under `--max-failures`, user errors never.
    """
    import ray

    config = replace(config, storage_path=storage_path, run_name=name)  # where the workers resume from

    def attempt_once(number: int) -> Attempt:
        started = time.monotonic()
        # Every host of the shape, not only those Ray Train will pick: the GCS may take seconds to
        # mark a killed host dead, and it must still count as this attempt's when it does.
        hosts = watched_hosts(ray.nodes(), target.shape)
        board = progress.start_board(target.hosts) if config.step_timeout_s else None
        try:
            outcome: Outcome = Succeeded(_fit(target, config, board))
        except AlreadyTrained:
            raise
        except SliceUnavailableError as err:
            outcome = classify(err)
        except KeyboardInterrupt:
            outcome = Cancelled("interrupted (Ctrl-C or `ray job stop`)")
        except Exception as err:
            stalls = _stall_reports(board)
            if stalls:  # a watchdog stopped its worker: a hang, not the crash its exit looks like
                ranks = [f"Ray Train rank {r}" for r in range(target.hosts)]
                outcome = classify(NoProgressError(progress.describe_silence(stalls, config.step_timeout_s, ranks)))
            else:
                outcome = classify_failure(err, hosts)
        finally:
            if board is not None:
                progress.stop_board(board)
        return Attempt(number, outcome, (), None, time.monotonic() - started)

    return retry(attempt_once, budget, f"train {name}", log)


def _stall_reports(board: Any) -> dict[int, tuple[float, Any]]:
    import ray

    if board is None:
        return {}
    try:
        return ray.get(board.stall_reports.remote(), timeout=10)
    except Exception:  # the board went with its node: no reports to read
        return {}


def _fit(target: cli.SliceTarget, config: TrainConfig, board: Any) -> TrainResult:
    """One Ray Train run of `config.run_name` in `config.storage_path`: wait (bounded) for whole idle
    slices, fit, return the summary."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxTrainer

    from jobs.data import synthetic_dataset

    name, storage_path = config.run_name, config.storage_path
    shape = target.shape
    timeout = target.reserve_timeout_s or cli.DEFAULT_RESERVE_TIMEOUT_S
    started = time.monotonic()
    # Ray Train reserves the slices itself; wait for them here first, bounded, so that a missing
    # host gives our error (which hosts are there) rather than an endless rescheduling loop...
    wait_for_slices(shape, target.slices, timeout)
    # ...and bound Ray Train's own wait by what is left (the controller reads this variable).
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(max(30.0, timeout - (time.monotonic() - started)))

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
        checkpoint_config=CheckpointConfig(num_to_keep=2),
        # No retries inside Ray Train (run_training decides them), and a start that times out is an
        # error, not a retry forever.
        failure_config=FailureConfig(max_failures=0, max_preemption_failures=0, controller_failure_limit=0),
        worker_runtime_env={"env_vars": {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}},
    )
    cfg = ModelConfig(**config.model)
    dataset = synthetic_dataset(config.steps * config.global_batch, cfg.seq_len, cfg.vocab)
    trainer = JaxTrainer(
        train_loop_per_worker,
        train_loop_config={**asdict(config), BOARD_KEY: board},
        scaling_config=scaling,
        run_config=run_config,
        datasets={"train": dataset},
    )
    fit_started_at = time.time()
    result = trainer.fit()
    m = result.metrics or {}
    if m.get("already_done"):
        raise AlreadyTrained(f"run {name!r} is already at step {m['step']} (>= --steps); pass more --steps or another --name")
    if not m:
        raise RuntimeError("training reported no metrics")
    return TrainResult(
        run=name,
        storage_path=storage_path,
        target=target.describe(),
        params=int(m["params"]),
        start_step=int(m["start_step"]),
        steps=int(m["step"]),
        first_loss=float(m["first_loss"]),
        final_loss=float(m["loss"]),
        step_time_s=float(m["step_time_s"]),
        compile_s=float(m["compile_s"]),
        tokens_per_s=float(m["tokens_per_s"]),
        flops_per_s=float(m["flops_per_s"]),
        mfu=m.get("mfu"),
        platform=str(m["platform"]),
        devices=int(m["devices"]),
        processes=int(m["processes"]),
        first_step_at=float(m["first_step_at"]),
        driver_started_at=DRIVER_STARTED_AT,
        fit_started_at=fit_started_at,
        worker_started_at=float(m.get("worker_started_at", 0.0)),
        state_built_at=float(m.get("state_built_at", 0.0)),
        matmul_flops_per_s=m.get("matmul_flops_per_s"),
        checkpoint=result.checkpoint.path if result.checkpoint else None,
    )


def _parser() -> cli.JobArgumentParser:
    p = cli.JobArgumentParser(prog="python -m jobs.train", description=__doc__.split("\n\n")[0])
    cli.add_slice_flags(p)
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=cli.positive_int, default=50, help="train until this step (default 50)")
    g.add_argument("--batch-size", type=cli.positive_int, default=64, help="global batch in sequences (default 64)")
    g.add_argument("--learning-rate", type=cli.positive_number, default=3e-3)
    g.add_argument("--warmup-steps", type=cli.positive_int, default=5)
    g.add_argument("--checkpoint-every", type=cli.positive_int, default=10, metavar="STEPS")
    g.add_argument("--fsdp", type=cli.positive_int, default=None, help="parameter-sharding axis size (default: chips per host)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--name", default=None, help="run name; the same name resumes (default: train-<pod type>-x<slices>)")
    g.add_argument("--storage", default=None, help=f"checkpoint storage: a directory or gs://... (default: ${STORAGE_ENV}, else the env's bucket)")
    g.add_argument("--matmul-baseline", type=int, default=0, metavar="SIZE", help=argparse.SUPPRESS)  # bench/jobs_bench.py
    cli.add_fault_flags(p, step_timeout_s=DEFAULT_STEP_TIMEOUT_S)
    m = p.add_argument_group("model")
    defaults = ModelConfig()
    m.add_argument("--seq-len", type=cli.positive_int, default=defaults.seq_len)
    m.add_argument("--d-model", type=cli.positive_int, default=defaults.d_model)
    m.add_argument("--layers", type=cli.positive_int, default=defaults.n_layers)
    m.add_argument("--heads", type=cli.positive_int, default=defaults.n_heads)
    m.add_argument("--d-ff", type=cli.positive_int, default=None, help="default: 4 x d-model")
    m.add_argument("--vocab", type=cli.positive_int, default=defaults.vocab)
    return p


def parse_config(argv: Sequence[str] | None = None) -> tuple[cli.SliceTarget, TrainConfig, str, str, RetryBudget]:
    parser = _parser()
    args, target = cli.parse(parser, argv)
    try:
        model = ModelConfig(args.vocab, args.seq_len, args.d_model, args.layers, args.heads, args.d_ff or 4 * args.d_model)
    except ValueError as err:
        parser.error(f"argument --heads: {err}")
    devices = target.shape.jax_devices * target.slices
    if args.batch_size % devices:
        parser.error(f"argument --batch-size: {args.batch_size} must be a multiple of the {devices} chips of {target.describe()}")
    fsdp = args.fsdp or 0
    if fsdp and target.shape.jax_devices_per_host % fsdp:
        parser.error(f"argument --fsdp: {fsdp} must divide the {target.shape.jax_devices_per_host} chips of a host")
    storage = args.storage or default_storage(target)
    if not storage:
        parser.error(f"argument --storage: needed (no ${STORAGE_ENV} and no environment config with a bucket)")
    config = TrainConfig(
        model=model.to_dict(),
        steps=args.steps,
        global_batch=args.batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        checkpoint_every=args.checkpoint_every,
        fsdp=fsdp,
        seed=args.seed,
        peak_flops=target.peak_bf16_flops,
        matmul_baseline=args.matmul_baseline,
        step_timeout_s=args.step_timeout,
    )
    name = args.name or f"train-{target.shape.pod_type}-x{target.slices}"
    return target, config, name, storage, RetryBudget.from_args(args)


parse_args = parse_config  # what jobs.submit checks a job's arguments with


def main(argv: Sequence[str] | None = None) -> int:
    from jobs.healthcheck import connect_ray

    target, config, name, storage, budget = parse_config(argv)
    print(f"train: {name} on {target.describe()}, {config.steps} steps, checkpoints in {storage}", flush=True)
    connect_ray()
    try:
        report = run_training(target, config, name, storage, budget, log=lambda line: print(line, flush=True))
    except AlreadyTrained as err:
        print(f"train: {err}", flush=True)
        return 0
    if not report.ok:
        return report_failure(report, "train")
    result = report.value
    print(result.summary(), flush=True)
    print_attempts(report)
    print("TRAIN " + json.dumps({**asdict(result), "attempts": len(report.attempts)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
