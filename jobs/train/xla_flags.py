"""The compiler flags each platform's training step gets, as data with their sources (read
2026-12-06): what MaxText's and NVIDIA JAX-Toolbox's recipes set, less what this JAX no longer
knows. An XLA flag XLA does not know aborts the process ("Unknown flag in XLA_FLAGS"), so every GPU
flag here was checked to parse on jax 0.10.2 and 0.11.2 (a CPU start-up with each one); whether it
helps on a GPU is the GPU bench's to say (bench/gpu_mfu.py runs the final variant with and
without). `jobs.train` sets them in each worker's environment before JAX starts its backend
(`--xla-flags off` leaves them out); the bench sets them per variant.

Only the standard library: loads by path (bench/gpu_mfu.py).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass


@dataclass(frozen=True)
class FlagSet:
    platform: str  # JAX's: "gpu" (cuda), "tpu"
    variable: str  # where the platform's compiler reads them
    flags: tuple[str, ...]
    source: str
    generations: tuple[str, ...] = ()  # TPU only: the generations the source tuned them for


GPU = FlagSet(
    "gpu",
    "XLA_FLAGS",
    (
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        "--xla_gpu_enable_command_buffer=",
        "--xla_gpu_all_reduce_combine_threshold_bytes=1073741824",
        "--xla_gpu_all_gather_combine_threshold_bytes=1073741824",
        "--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728",
        "--xla_gpu_enable_pipelined_all_gather=true",
        "--xla_gpu_enable_pipelined_reduce_scatter=true",
        "--xla_gpu_enable_pipelined_all_reduce=true",
        "--xla_gpu_enable_while_loop_double_buffering=true",
        "--xla_gpu_enable_all_gather_combine_by_dim=false",
        "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
        "--xla_disable_hlo_passes=rematerialization",
        "--xla_gpu_enable_triton_gemm=false",
    ),
    "NVIDIA/JAX-Toolbox docs/frameworks/maxtext/README.md:72-83 (bcbbfa57), the set it recommends for MaxText on H100; "
    "plus --xla_gpu_enable_triton_gemm=false from AI-Hypercomputer/maxtext src/maxtext/configs/gpu/a3/llama_2_7b/1vm.sh:21-29 "
    "(e591f30c), whose newer --xla_gpu_pipeline_*=on spellings jax 0.10.2 refuses",
)
TPU_V6E = FlagSet(
    "tpu",
    "LIBTPU_INIT_ARGS",
    (
        "--xla_tpu_scoped_vmem_limit_kib=98304",
        "--xla_tpu_use_minor_sharding_for_major_trivial_input=true",
        "--xla_tpu_relayout_group_size_threshold_for_reduce_scatter=1",
        "--xla_tpu_assign_all_reduce_scatter_layout=true",
        "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
        "--xla_tpu_data_parallel_opt_different_sized_ops=true",
        "--xla_tpu_enable_async_collective_fusion=true",
        "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
        "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
        "--xla_tpu_overlap_compute_collective_tc=true",
        "--xla_enable_async_all_gather=true",
    ),
    "AI-Hypercomputer/maxtext benchmarks/xla_flags_library.py:30-55,128-147 (e591f30c): DENSE_VMEM_LIMIT_FLAG, "
    "LAYOUT_FOR_ALL_REDUCE_SCATTER, DATA_PARALLEL_OVERLAP and CF_FOR_ALL_GATHER, as benchmarks/maxtext_trillium_model_configs.py:746-753 "
    "gives llama3_1_8b_8192 on v6e (its SparseCore and host-offload sets are left out: they serve MaxText's offloading remat policy)",
    generations=("v6e",),
)
SETS = (GPU, TPU_V6E)


def for_platform(platform: str, generation: str = "") -> FlagSet | None:
    """The flags for JAX's `platform` ("gpu", "cuda", "tpu") and, on TPU, the generation (pure)."""
    platform = "gpu" if platform == "cuda" else platform
    for flag_set in SETS:
        if flag_set.platform == platform and (not flag_set.generations or generation in flag_set.generations):
            return flag_set
    return None


def apply(environ: MutableMapping[str, str], platform: str, generation: str = "") -> FlagSet | None:
    """Append the platform's flags to its variable in `environ` (before the backend starts: XLA and
    libtpu read them once); a flag already set there is left as it is. The set applied, or None."""
    flag_set = for_platform(platform, generation)
    if flag_set is None:
        return None
    current = environ.get(flag_set.variable, "").split()
    given = {f.split("=", 1)[0] for f in current}
    environ[flag_set.variable] = " ".join([*current, *(f for f in flag_set.flags if f.split("=", 1)[0] not in given)])
    return flag_set
