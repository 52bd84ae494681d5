"""Train a Llama-architecture LM on whole TPU slices, the way Ray recommends for TPUs.

    python -m jobs.train --generation v6e --topology 4x4 [--preset tiny|125m|1b|8b] [--steps N] [--storage DIR|gs://...] [--name RUN]

Ray Train's `JaxTrainer` with `ScalingConfig(use_tpu=True, topology, accelerator_type, num_workers =
hosts x slices)` reserves the slices itself (one worker per host) and initializes `jax.distributed`;
Ray Data feeds each worker its shard of synthetic token rows (`get_dataset_shard`). The batch is
split over a (data, fsdp) mesh of every chip; parameters and optimizer state are sharded over the
fsdp axis (every chip of a slice by default: over ICI, so per-chip memory falls as the slice grows)
and replicated over data (one row per slice: over DCN). The model (jobs.train.model) is a Llama
decoder whose parameters export under Hugging Face's names (jobs.train.hf).

Checkpoints go through `ray.train.report(checkpoint=...)` to `RunConfig(storage_path=...)`: the
simulation's shared directory (`JOBS_STORAGE_PATH`, set by `jobs.local`) or else the environment
config's `gs://` bucket. Rerunning with the same `--name` resumes from the newest whole checkpoint
(`jobs.train.checkpoints`: one cut short is skipped).

A lost host, a hang (`--step-timeout`) or a crash ends the Ray Train run; `run_training` reruns it on
a whole slice from the newest checkpoint within `--max-preemptions` / `--max-failures`, as
`jobs.runtime.reruns` does for every job. A user error is not rerun.

Reports step time, tokens/s, achieved FLOP/s and, on TPU, MFU against the catalog's peak; prints a
summary and one `TRAIN {json}` line. Exit status: 0 done, 1 failed (or no slice in time), 2 bad flags,
130 cancelled.
"""

from jobs.train.config import parse_args, parse_config

__all__ = ["parse_args", "parse_config"]

# Modules: config (flags -> TrainConfig), model and data (pure JAX / Ray Data), state (the sharded
# model and optimizer of one worker), worker (the SPMD loop each Ray Train worker runs), fit (one
# Ray Train run per attempt, rerun on whole slices), checkpoints (whole-or-skipped checkpoints).
