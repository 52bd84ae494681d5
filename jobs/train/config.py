"""The training job's flags, and what they turn into: the `TrainConfig` every worker gets, the
`StepMetrics` a worker reports at each checkpoint, and the `TrainResult` the driver prints."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from jobs import cli
from jobs.runtime import compile_cache, storage
from jobs.runtime.reruns import RetryBudget
from jobs.train import elastic, hf, hf_import, text
from jobs.train.attention import IMPLEMENTATIONS
from jobs.train.model import PRESETS, ModelConfig, param_count, with_overrides
from jobs.train.remat import POLICIES

STORAGE_ENV = "JOBS_STORAGE_PATH"
# A step (or a batch, or a checkpoint) that takes this long is a hang. The first step includes
# starting Ray Data and compiling, which on a big model takes minutes: leave room for it.
DEFAULT_STEP_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class TrainConfig:
    """Everything a worker needs (sent as `train_loop_config`)."""

    model: dict[str, Any]  # ModelConfig.to_dict()
    steps: int
    global_batch: int
    learning_rate: float
    warmup_steps: int
    checkpoint_every: int
    fsdp: int  # the parameter-sharding axis: the chips of a slice, or a divisor of them
    seed: int
    peak_flops: float  # the slices' bf16 peak, for MFU on TPU
    matmul_baseline: int  # >0: also time a dense matmul of this size per device, for the benchmark
    step_timeout_s: float = 0.0  # >0: a worker silent this long reports a stall and exits
    storage_path: str = ""  # where the run's checkpoints are (RunConfig's storage_path/name)...
    run_name: str = ""  # ...listed to resume from the newest whole one
    data: str = ""  # training text (jobs.train.text); "" for synthetic tokens
    tokenizer: str = ""  # its tokenizer.json (rank 0 keeps a copy in the run directory for jobs.export)
    init_from: str = ""  # a Hugging Face Llama directory the run starts from when it has no checkpoint
    compilation_cache: str = ""  # JAX's persistent compilation cache (jobs.runtime.compile_cache); "" for none
    profile_steps: str = ""  # "A:B": trace steps A to B with JAX's profiler into <run>/profile/ (jobs.train.board)
    generation: str = ""  # the slices' TPU generation: which compiler flags the workers get (jobs.train.xla_flags)
    xla_flags: bool = True  # set them (--xla-flags off: not)
    slices: int = 1  # the run's whole size (--slices)...
    min_slices: int = 0  # ...and what it may shrink to (--min-slices; 0: never shrinks) (jobs.train.elastic)
    resize_check_s: float = 60.0  # a shrunk run looks for idle whole slices this often (--resize-check)
    attempt_slices: int = 0  # the slices this attempt runs on (set by the driver per attempt; 0: all)
    pod_type: str = ""  # the slices' (an elastic run counts the idle ones of it)

    @property
    def accumulation(self) -> int:
        """Micro-batches per step: the global batch kept on fewer slices (jobs.train.elastic)."""
        return elastic.accumulation(self.slices, self.attempt_slices or self.slices)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class StepMetrics:
    """What rank 0 reports with each checkpoint (`ray.train.report` takes a dict: `asdict` of this),
    read back by the driver from the result's metrics."""

    step: int
    start_step: int
    loss: float
    first_loss: float
    step_time_s: float  # median, compile step excluded
    compile_s: float
    tokens_per_s: float
    flops_per_s: float
    mfu: float | None
    platform: str
    devices: int
    processes: int
    params: int
    first_step_at: float
    worker_started_at: float
    state_built_at: float
    matmul_flops_per_s: float | None = None
    cache_hits: int = 0  # persistent compilation cache hits of rank 0's first step call (its executable found, not compiled)
    first_step_done_at: float = 0.0  # wall clock when the last host finished its first step
    hit_hosts: int = 0  # hosts whose step's executable came from the persistent cache
    checkpoint_step: int | None = None  # the newest committed checkpoint (None before the first commit)
    checkpoint_stall_s: float | None = None  # median time the loop was blocked per checkpoint save

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepMetrics:
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
    checkpoint_stall_s: float | None = None  # median time the training loop was blocked per save
    cache_hits: int = 0  # compilation cache hits of rank 0's first step (0: compiled)
    first_step_done_at: float = 0.0  # wall clock when the last host finished its first step
    hit_hosts: int = 0  # hosts whose step's executable came from the persistent cache
    goodput: dict[str, Any] | None = None  # the ledger's account of the run (jobs.runtime.goodput.Goodput.as_dict)
    goodput_summary: str = ""

    def summary(self) -> str:
        mfu = f"{self.mfu:.1%}" if self.mfu is not None else f"n/a on {self.platform}"
        resumed = f"resumed at step {self.start_step}, " if self.start_step else ""
        return "\n".join(
            [
                f"train {self.run}: {self.target}",
                f"  {resumed}steps {self.start_step}->{self.steps}, loss {self.first_loss:.3f} -> {self.final_loss:.3f}",
                f"  {self.params:,} parameters on {self.devices} {self.platform} devices in {self.processes} processes",
                f"  step {self.step_time_s * 1e3:.1f} ms (first step {self.compile_s:.1f} s with compilation; "
                f"its executable from the compilation cache on {self.hit_hosts} of {self.processes} hosts), "
                f"{self.tokens_per_s:,.0f} tokens/s, {self.flops_per_s / 1e9:.2f} GFLOP/s, MFU {mfu}",
                f"  checkpoint: {self.checkpoint}"
                + (f" (each save blocked training {self.checkpoint_stall_s * 1e3:.0f} ms)" if self.checkpoint_stall_s is not None else ""),
                *(["  " + line for line in self.goodput_summary.splitlines()] if self.goodput_summary else []),
            ]
        )


def mfu(flops_per_s: float, peak_flops: float, platform: str) -> float | None:
    """Model FLOP/s over the slices' peak; only meaningful on TPU (pure)."""
    return flops_per_s / peak_flops if platform == "tpu" and peak_flops > 0 else None


def default_storage(target: cli.SliceTarget) -> str | None:
    if os.environ.get(STORAGE_ENV):
        return os.environ[STORAGE_ENV]
    return f"gs://{target.bucket_name}/ray-train" if target.bucket_name else None


def _parser() -> cli.JobArgumentParser:
    p = cli.JobArgumentParser(prog="python -m jobs.train", description="Train a Llama-architecture LM on whole TPU slices.")
    cli.add_slice_flags(p)
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=cli.positive_int, default=50, help="train until this step (default 50)")
    g.add_argument("--batch-size", type=cli.positive_int, default=64, help="global batch in sequences (default 64)")
    g.add_argument("--learning-rate", type=learning_rate, default=3e-3, help="peak learning rate (default 3e-3; 0 checks an import)")
    g.add_argument("--warmup-steps", type=cli.positive_int, default=5)
    g.add_argument("--checkpoint-every", type=cli.positive_int, default=10, metavar="STEPS")
    g.add_argument("--fsdp", type=cli.positive_int, default=None, help="parameter-sharding axis size (default: every chip of a slice)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--min-slices",
        type=cli.positive_int,
        default=None,
        metavar="K",
        help="elastic: a run that loses a slice keeps training on >= K whole slices and grows back at a step boundary "
        "(default: all --slices; see jobs.train.elastic)",
    )
    g.add_argument(
        "--resize-check",
        type=cli.positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="elastic: how often a shrunk run looks for whole idle slices to grow onto (default 60, Ray Train's "
        "elastic_resize_monitor_interval_s)",
    )
    g.add_argument("--name", default=None, help="run name; the same name resumes (default: train-<pod type>-x<slices>)")
    g.add_argument(
        "--storage", default=None, help=f"checkpoint storage: a directory or gs://... (default: ${STORAGE_ENV}, else the env's bucket)"
    )
    g.add_argument(
        "--data",
        default=None,
        metavar="PATH",
        help="train on this text: a parquet / JSON lines / .txt file or directory, local or gs:// (default: synthetic tokens)",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="a Hugging Face tokenizer.json, local or gs:// (default with --data: the one the repo ships); sets --vocab",
    )
    g.add_argument(
        "--init-from",
        default=None,
        metavar="DIR",
        help="start from this Hugging Face Llama directory, local or gs:// (its config.json is the model's shape; "
        "its tokenizer.json the default --tokenizer); a run with a checkpoint resumes from it instead",
    )
    g.add_argument(
        "--compilation-cache",
        default=None,
        metavar="DIR",
        help=f"JAX's persistent compilation cache, shared by every attempt and run: a directory or gs://..., or "
        f"'{compile_cache.DISABLED}' (default: ${compile_cache.CACHE_ENV}, else gs://BUCKET/{compile_cache.XLA_CACHE_DIR}/"
        f"{compile_cache.TRAIN_CACHE} of --storage's bucket, or --storage/.{compile_cache.XLA_CACHE_DIR} for a local one)",
    )
    g.add_argument(
        "--profile-steps",
        type=profile_steps,
        default=None,
        metavar="A:B",
        help="trace steps A to B (1-based) with JAX's profiler into <run>/profile/, for xprof or TensorBoard's profile plugin",
    )
    g.add_argument(
        "--xla-flags",
        choices=("on", "off"),
        default="on",
        help="the compiler flags MaxText's and JAX-Toolbox's recipes set, per platform (jobs/train/xla_flags.py; default on)",
    )
    g.add_argument("--matmul-baseline", type=int, default=0, metavar="SIZE", help=argparse.SUPPRESS)  # bench/jobs_bench.py
    cli.add_fault_flags(p, step_timeout_s=DEFAULT_STEP_TIMEOUT_S)
    m = p.add_argument_group("model (a Llama-architecture decoder: jobs/train/model.py)")
    m.add_argument(
        "--preset",
        choices=sorted(PRESETS, key=lambda n: param_count(PRESETS[n])),
        default=None,
        help="model size (default tiny; none with --init-from); the flags below override its fields",
    )
    m.add_argument("--seq-len", type=cli.positive_int, default=None)
    m.add_argument("--d-model", type=cli.positive_int, default=None)
    m.add_argument("--layers", type=cli.positive_int, default=None)
    m.add_argument("--heads", type=cli.positive_int, default=None, help="query heads")
    m.add_argument("--kv-heads", type=cli.positive_int, default=None, help="key/value heads (grouped-query attention)")
    m.add_argument("--d-ff", type=cli.positive_int, default=None, help="MLP width (default: the preset's ratio to d-model)")
    m.add_argument("--vocab", type=cli.positive_int, default=None)
    m.add_argument(
        "--attention",
        choices=IMPLEMENTATIONS,
        default=None,
        help="attention: splash on TPU, cuDNN on GPU, XLA elsewhere with auto (the default); jobs/train/attention.py",
    )
    m.add_argument(
        "--remat",
        choices=POLICIES,
        default=None,
        metavar="POLICY",
        help=f"what each layer keeps for the backward pass: {', '.join(POLICIES)} (default: the preset's; jobs/train/remat.py)",
    )
    return p


def profile_steps(text_: str) -> str:
    """A:B, checked (jobs.train.board.parse_steps)."""
    from jobs.train.board import parse_steps

    try:
        parse_steps(text_)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text_


def learning_rate(text_: str) -> float:
    """0 or more: a run at 0 checks an import (its loss stays the source model's)."""
    try:
        if float(text_) == 0:  # any spelling of zero: 0, 0.0, 0e0, -0
            return 0.0
    except ValueError:
        pass  # not a number: positive_number says so, naming what is valid
    return cli.positive_number(text_)


# Our shape flags -> (ModelConfig field, config.json key), for --init-from.
SHAPE_FLAGS = {
    "vocab": ("vocab", "vocab_size"),
    "d_model": ("d_model", "hidden_size"),
    "layers": ("n_layers", "num_hidden_layers"),
    "heads": ("n_heads", "num_attention_heads"),
    "kv_heads": ("n_kv_heads", "num_key_value_heads"),
    "d_ff": ("d_ff", "intermediate_size"),
}


def imported_model_config(args: argparse.Namespace, config: dict[str, Any], where: str) -> ModelConfig:
    """The model of a Hugging Face `config.json` (--init-from); ValueError names the flag or key
    that disagrees with it (pure)."""
    try:
        model, _ = hf.parse_config(config)
    except hf.HFConfigError as err:
        raise ValueError(f"argument --init-from: {where}: {err}") from None
    for flag, (name, key) in SHAPE_FLAGS.items():
        given = getattr(args, flag)
        if given is not None and given != getattr(model, name):
            raise ValueError(f"argument --{flag.replace('_', '-')}: {given} disagrees with {key} {getattr(model, name)} in {where}")
    if args.seq_len is not None:  # shorter sequences than the model was made for are fine
        if args.seq_len > model.seq_len:
            raise ValueError(f"argument --seq-len: {args.seq_len} is longer than max_position_embeddings {model.seq_len} in {where}")
        model = replace(model, seq_len=args.seq_len)
    return model


def model_config(args: argparse.Namespace) -> ModelConfig:
    """The preset with the shape flags given; ValueError says which rule a combination breaks."""
    return with_overrides(
        PRESETS[args.preset or "tiny"],
        vocab=args.vocab,
        seq_len=args.seq_len,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        d_ff=args.d_ff,
    )


def parse_config(
    argv: Sequence[str] | None = None, *, read_files: bool = True
) -> tuple[cli.SliceTarget, TrainConfig, str, str, RetryBudget]:
    """The job's flags, checked. With `read_files` (the job itself, not `jobs.submit`'s check on a
    laptop that may not reach them) the tokenizer is read, the model's vocab set from it, and the
    data path listed."""
    parser = _parser()
    args, target = cli.parse(parser, argv)
    if args.init_from and args.preset:
        parser.error("argument --preset: not with --init-from (the model's shape is the directory's config.json)")
    if args.init_from and read_files:
        args.init_from = storage.join(args.init_from)  # as the job's working directory sees it
        where = storage.join(args.init_from, hf_import.CONFIG_FILE)
        try:
            model = imported_model_config(args, hf_import.read_config(args.init_from), where)
            if not storage.is_remote(args.init_from):  # headers only: a wrong tensor fails here, not on the slice
                hf_import.check_headers(args.init_from, model)
        except (hf_import.HFImportError, storage.StorageError) as err:
            parser.error(f"argument --init-from: {err}")
        except ValueError as err:
            parser.error(str(err))
    else:  # (jobs.submit's check without the files: the job itself reads the model's shape)
        try:
            model = model_config(args)
        except ValueError as err:
            flag = "--kv-heads" if "n_kv_heads" in str(err) else "--heads"
            parser.error(f"argument {flag}: {err}")
    model = replace(model, attention=args.attention or model.attention, remat=args.remat or model.remat)
    tokenizer = args.tokenizer or (str(text.TOKENIZER) if args.data else "")
    if args.init_from and not args.tokenizer and read_files:  # the model's own tokenizer, never the shipped one
        own = storage.join(args.init_from, hf_import.TOKENIZER_FILE)
        if storage.exists(own):
            tokenizer = own
        elif args.data:
            parser.error(f"argument --init-from: {args.init_from} has no tokenizer.json for --data; pass --tokenizer")
    if read_files:  # local paths as the job's working directory sees them, before anything moves it
        tokenizer = tokenizer and storage.join(tokenizer)
        args.data = args.data and storage.join(args.data)
    if read_files and tokenizer:
        try:
            _, tok = text.load_tokenizer(tokenizer)
            text.eos_id(tok, tokenizer)
        except text.DataError as err:
            parser.error(f"argument --tokenizer: {err}")
        size = tok.get_vocab_size()
        if args.init_from and size > model.vocab:
            parser.error(f"argument --tokenizer: its {size} tokens are more than vocab_size {model.vocab} of --init-from {args.init_from}")
        elif args.init_from:
            pass  # the model's vocab is its config.json's
        elif args.vocab is None:
            model = replace(model, vocab=size)
        elif args.vocab < size:
            parser.error(f"argument --vocab: {args.vocab} is smaller than the {size} tokens of --tokenizer {tokenizer}")
    if read_files and args.data:
        try:
            text.data_files(args.data)
        except text.DataError as err:
            parser.error(f"argument --data: {err}")
    devices = target.shape.jax_devices * target.slices
    if args.batch_size % devices:
        parser.error(f"argument --batch-size: {args.batch_size} must be a multiple of the {devices} chips of {target.describe()}")
    min_slices = args.min_slices or target.slices
    problem = elastic.size_problem(target.slices, min_slices)
    if problem:
        parser.error(f"argument --min-slices: {problem}")
    fsdp = args.fsdp or target.shape.jax_devices
    if target.shape.jax_devices % fsdp:
        parser.error(f"argument --fsdp: {fsdp} must divide the {target.shape.jax_devices} chips of a slice")
    storage_path = args.storage or default_storage(target)
    if not storage_path:
        parser.error(f"argument --storage: needed (no ${STORAGE_ENV} and no environment config with a bucket)")
    cache = compile_cache.resolve(args.compilation_cache, storage_path) if read_files else ""
    if cache:  # an unreachable gs:// cache hangs JAX's first compile: refuse it here instead
        try:
            compile_cache.check_reachable(cache)
        except compile_cache.CacheError as err:
            parser.error(f"argument --compilation-cache: {err}")
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
        data=args.data or "",
        tokenizer=tokenizer,
        init_from=args.init_from or "",
        compilation_cache=cache,
        profile_steps=args.profile_steps or "",
        generation=target.shape.generation.name,
        xla_flags=args.xla_flags == "on",
        slices=target.slices,
        pod_type=target.shape.pod_type,
        min_slices=min_slices,
        resize_check_s=args.resize_check,
    )
    name = args.name or f"train-{target.shape.pod_type}-x{target.slices}"
    return target, config, name, storage_path, RetryBudget.from_args(args)


def parse_args(argv: Sequence[str] | None = None) -> tuple[cli.SliceTarget, TrainConfig, str, str, RetryBudget]:
    """What jobs.submit checks a job's arguments with (on the laptop: no files read)."""
    return parse_config(argv, read_files=False)


def as_json(result: TrainResult) -> dict[str, Any]:
    return asdict(result)
