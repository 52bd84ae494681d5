"""Where a batch run's vLLM engines go and how they are built (Ray Data's LLM processor), and what
vLLM's `finish_reason` was for a row (Ray Data's processor drops it).

The layout (`layout`, pure): one engine per host, as data parallelism. A host's chips hold any
preset's weights (8b in bf16 is 16 GB, a v6e host has 4 x 32 GB), so tensor parallelism over a
host's chips (one process drives them all, `uni` executor) is enough, and a batch run has no
latency to buy with cross-host tensor parallelism: hosts would only wait on each other's
collectives. Serving differs (one engine per slice, tensor parallel over all its chips: a request's
latency is what it sells). On the simulation (hosts whose JAX runs on CPU) each engine is vLLM's CPU
engine with the settings serving uses there (float32, eager), its worker in the engine core's
process and the machine's cores shared out as its threads (CPU_ENGINE_ENV); with no cluster, one
CPU engine.

The slice is reserved whole first (jobs.runtime.reservation, as every job here does), and the
engines are placed in that reservation's host bundles, one each.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra import catalog

VLLM_STAGE = "vLLMEngineStage"
# What `vllm.LLM` schedules per step by default, (max_num_seqs, max_num_batched_tokens), per platform:
# vLLM 0.29.0 vllm/engine/arg_utils.py EngineArgs.get_batch_defaults, UsageContext.LLM_CLASS, read
# 2026-12-06. Ray Data's engine is an AsyncLLM built without a usage context, so it would get the
# generic SchedulerConfig defaults (128 sequences, 2048 tokens): half of what `vllm.LLM.generate`
# runs on CPU. Set here, each engine runs as the offline `vllm.LLM` would on its platform (chips not
# named there take its other-hardware row).
OFFLINE_BATCH_DEFAULTS: dict[str, tuple[int, int]] = {
    "cpu": (256, 4096),
    "v6e": (256, 2048),
    "v5e": (256, 1024),
    "v5p": (256, 512),
    "other": (256, 8192),
}
# A CPU engine's worker runs inside its EngineCore process: one process and one import of vLLM
# fewer per engine (about 13 s of a 2-core machine's start-up, which a rerun pays again). vLLM 0.29.0,
# read 2026-12-06: Ray Data's engine is an AsyncLLM, whose EngineCore always runs in a process of its
# own (vllm/v1/engine/async_llm.py, make_async_mp_client); on CPU the "uni" executor is turned into
# "mp", a Worker process more, unless VLLM_ENABLE_V1_MULTIPROCESSING is 0 (vllm/platforms/cpu.py,
# CpuPlatform.check_and_update_config). With the variable at 0 and "uni", the EngineCore process
# runs the model itself; the engine is still the AsyncLLM, in its own process.
CPU_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# ... and its torch threads: the machine's cores shared out among the engines on it. Ray gives an
# actor of one CPU OMP_NUM_THREADS=1, and in its own process vLLM's CPU worker keeps what it finds
# (vllm/v1/worker/cpu_worker.py skips torch.set_num_threads; vllm/utils/torch_utils.py
# set_torch_threads_for_runtime respects a set OMP_NUM_THREADS). On 2 cores, jobs.batch over the
# small bench model's 1024 prompts took 76-80 s with 2 threads, 88-92 s with 1 (2026-12-06).
# Rows per block sent to an engine, and how many blocks each engine runs at once: enough rows in
# flight (8 x 64 = 512) to keep the scheduler's 256 sequences full while finished blocks come back.
BATCH_ROWS = 64
CONCURRENT_BATCHES = 8


@dataclass(frozen=True)
class EngineLayout:
    engines: int
    bundle: dict[str, float]  # one engine's resources: a host's bundle of the reservation
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    accelerator_type: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)  # the engines' process environment

    def describe(self) -> str:
        tp = self.engine_kwargs.get("tensor_parallel_size", 1)
        kind = "CPU" if self.accelerator_type is None else self.accelerator_type
        return f"{self.engines} vLLM engine(s), one per host, tensor parallel {tp} ({kind})"


def input_blocks(rows: int, engines: int) -> int:
    """How many blocks `rows` prompts go to `engines` engines in (pure): one engine batch each
    (BATCH_ROWS), and at least one per engine while there are rows for them. Ray Data would split
    them into at least 200 (Ray 2.60 ray/data/context.py DEFAULT_READ_OP_MIN_NUM_BLOCKS, read
    2026-12-07), a preprocess and a postprocess task each: 1024 prompts made about 2000 tasks of a
    few rows, scheduled on the cores the engines start and run on."""
    return max(1, min(rows, max(-(-rows // BATCH_ROWS), engines)))


def scheduler_kwargs(platform: str) -> dict[str, int]:
    """The offline `vllm.LLM` scheduler defaults of `platform` ("cpu" or a TPU generation) (pure)."""
    seqs, tokens = OFFLINE_BATCH_DEFAULTS.get(platform, OFFLINE_BATCH_DEFAULTS["other"])
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}


def cpu_engine_env(engines: int, machine_cores: int) -> dict[str, str]:
    """The process environment of each of `engines` CPU engines sharing `machine_cores` (pure)."""
    return {**CPU_ENGINE_ENV, "OMP_NUM_THREADS": str(max(1, machine_cores // max(1, engines)))}


def layout(shape: catalog.SliceShape | None, slices: int, on_cpu: bool, max_model_len: int, machine_cores: int = 1) -> EngineLayout:
    """The engines of a run on `slices` slices of `shape` (None: no cluster, this machine) (pure).
    `machine_cores`: the cores of the machine that runs CPU engines (this one, or the simulation's)."""
    cpu = {
        "max_model_len": max_model_len,
        "dtype": "float32",
        "enforce_eager": True,
        "distributed_executor_backend": "uni",
        **scheduler_kwargs("cpu"),
    }
    if shape is None:
        return EngineLayout(1, {"CPU": 1}, cpu, env_vars=cpu_engine_env(1, machine_cores))
    bundle = {"CPU": 1.0, "TPU": float(shape.chips_per_host)}
    if on_cpu:
        return EngineLayout(shape.hosts * slices, bundle, cpu, env_vars=cpu_engine_env(shape.hosts * slices, machine_cores))
    kwargs = {
        "max_model_len": max_model_len,
        "tensor_parallel_size": shape.chips_per_host,
        "distributed_executor_backend": "uni",
        **scheduler_kwargs(shape.generation.name),
    }
    return EngineLayout(shape.hosts * slices, bundle, kwargs, shape.generation.ray_accelerator_type)


def eos_ids(model_dir: str) -> frozenset[int]:
    """The token ids that end a completion with finish_reason "stop": the model's EOS ids, from its
    config.json and generation_config.json (vLLM adds the latter's to the stop tokens)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir, name)
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return frozenset(int(i) for i in ids)


def finish_reason(tokens: Any, eos: frozenset[int]) -> str:
    """vLLM's finish_reason of a completion with no stop strings (pure): "stop" when its last token is
    an EOS id (vLLM checks EOS and stop tokens before the length), else "length" (max_tokens or the
    model's length)."""
    tokens = list(tokens) if tokens is not None else []
    return "stop" if tokens and int(tokens[-1]) in eos else "length"


def import_processor() -> None:
    """Import Ray Data's LLM processor without vLLM in this process (the driver), which never runs an
    engine. Ray 2.60's vLLM stage module imports vLLM only to name its fatal errors, under
    `try/except ImportError` (ray/llm/_internal/common/errors.py, read 2026-12-06); each engine's
    process imports that module again, with vLLM. vLLM's import is about 9 s of a 2-core machine's
    CPU that the driver would spend while Ray and the engines start."""
    blocked = "vllm" not in sys.modules
    if blocked:
        sys.modules["vllm"] = None  # type: ignore[assignment]  # `import vllm...` raises ImportError
    try:
        # What building the processor imports: transformers, and through its AutoConfig the Llama
        # config's module (about 3 s; every model jobs.batch takes is a Llama, model_problem).
        import transformers.models.llama.configuration_llama  # noqa: F401
        from ray.llm._internal.batch.stages import vLLMEngineStage  # noqa: F401
    finally:
        if blocked and sys.modules.get("vllm", False) is None:
            del sys.modules["vllm"]


def build(
    model_dir: str,
    engines: EngineLayout,
    max_tokens: int,
    temperature: float,
    placement_group: Any = None,
    batch_size: int = BATCH_ROWS,
    env_vars: dict[str, str] | None = None,
):
    """Ray Data's LLM processor for raw-text prompts: no chat template (prompts go to the engine as
    `vllm.LLM.generate(list_of_str)` takes them), the layout's bundles (not the GPU bundles it
    reserves by default), its engines in `placement_group`'s bundles when given. Rows in: `_row`,
    `prompt`; rows out: `_row`, `completion`, `prompt_tokens`, `completion_tokens`, `finish_reason`.
    `env_vars`: the engines' environment (a CPU engine's KV cache size, offline caches)."""
    import_processor()
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from infra.serving import offline_env_vars

    eos = eos_ids(model_dir)
    sampling = {"temperature": temperature, "max_tokens": max_tokens}
    config = vLLMEngineProcessorConfig(
        model_source=model_dir,
        engine_kwargs=dict(engines.engine_kwargs),
        chat_template_stage=False,
        # The engine tokenizes the text itself, as `vllm.LLM.generate` does (its output carries the
        # prompt's token ids): no tokenizer actor to start and feed.
        tokenize_stage=False,
        # vLLM's own text, not a second decode: Ray Data's detokenize stage decodes the tokens whole,
        # where vLLM's incremental detokenizer holds back a cut UTF-8 sequence at the end (the two
        # differed on a byte-level completion in the tests); one actor fewer too.
        detokenize_stage=False,
        batch_size=batch_size,
        max_concurrent_batches=CONCURRENT_BATCHES,
        concurrency=(engines.engines, engines.engines),
        # No accelerator_type: its label resource is not in the reservation's bundles, and the
        # reservation already picked the hosts of the right type.
        placement_group_config={"bundles": [dict(engines.bundle)]},
        runtime_env={"env_vars": env} if (env := {**offline_env_vars(), **(env_vars or {}), **engines.env_vars}) else None,
        log_engine_metrics=False,
    )
    processor = build_processor(
        config,
        preprocess=lambda row: {"_row": row["_row"], "prompt": row["prompt"], "sampling_params": sampling},
        postprocess=lambda row: {
            "_row": row["_row"],
            "completion": row["generated_text"],
            "prompt_tokens": int(row["num_input_tokens"]),
            "completion_tokens": int(row["num_generated_tokens"]),
            "finish_reason": finish_reason(row.get("generated_tokens"), eos),
        },
    )
    if placement_group is not None:  # each engine in a host bundle of the slice reserved whole
        stage = processor.get_stage_by_name(VLLM_STAGE)
        stage.map_batches_kwargs["scheduling_strategy"] = PlacementGroupSchedulingStrategy(placement_group)
    return processor
