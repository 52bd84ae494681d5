"""Train a Llama-architecture LM on whole TPU slices, the way Ray recommends for TPUs.

    python -m jobs.train --generation v6e --topology 4x4 [--preset tiny|125m|1b|8b] [--steps N] [--storage DIR|gs://...] [--name RUN]
        [--data PATH [--tokenizer tokenizer.json]]

Ray Train's `JaxTrainer` with `ScalingConfig(use_tpu=True, topology, accelerator_type, num_workers =
hosts x slices)` reserves the slices itself (one worker per host) and initializes `jax.distributed`;
Ray Data feeds each worker its shard of token rows (`get_dataset_shard`): synthetic, or real text
tokenized and packed by Ray Data (`--data`, jobs.train.text). The batch is
split over a (data, fsdp) mesh of every chip; parameters and optimizer state are sharded over the
fsdp axis (every chip of a slice by default: over ICI, so per-chip memory falls as the slice grows)
and replicated over data (one row per slice: over DCN). The model (jobs.train.model) is a Llama
decoder whose parameters export under Hugging Face's names (jobs.train.hf).

Checkpoints are Orbax's (jobs.train.checkpoints: every host writes its own shards, in the
background), in the run's Ray Train directory under `--storage`: the simulation's shared directory
(`JOBS_STORAGE_PATH`, set by `jobs.local`) or else the environment config's `gs://` bucket; Ray Train
registers each committed one (`NO_UPLOAD`). Rerunning with the same `--name` resumes from the newest
committed checkpoint that reads back. `python -m jobs.export` turns one into a Hugging Face model.

A lost host, a hang (`--step-timeout`) or a crash ends the Ray Train run; `run_training` reruns it on
a whole slice from the newest checkpoint within `--max-preemptions` / `--max-failures`, as
`jobs.runtime.reruns` does for every job. A user error is not rerun.

Reports step time, tokens/s, achieved FLOP/s and, on TPU, MFU against the catalog's peak; prints a
summary and one `TRAIN {json}` line. Exit status: 0 done, 1 failed (or no slice in time), 2 bad flags,
130 cancelled.
"""

from jobs.train.config import parse_args, parse_config

__all__ = ["REQUIREMENTS", "RUN_NAME_FLAG", "parse_args", "parse_config"]

# What the job needs beyond the TPU image (Ray, JAX, optax): Orbax, the tokenizer, safetensors, and
# gcsfs, through which Orbax reaches gs://. `jobs.submit` adds them to the job's runtime env; pinned
# as pyproject.toml's [jobs] extra pins them (tests/jobs/test_submit_cli.py checks).
# The flag that names a run (its checkpoints and goodput ledger): `jobs.submit --print-rayjob` passes
# the RayJob's name through it unless the job's own arguments name the run, so a RayJob that Kueue
# evicts and admits again resumes its own run, and two RayJobs of one shape never share one.
RUN_NAME_FLAG = "--name"
REQUIREMENTS = ("orbax-checkpoint==0.12.8", "tokenizers==0.23.3", "safetensors==0.8.0", "gcsfs==2026.10.1", "tensorboardX==2.6.5")

# Modules: config (flags -> TrainConfig), model and data (pure JAX / Ray Data), text (real text and
# the shipped tokenizer), hf (Hugging Face names), state (the sharded model and optimizer of one
# worker), worker (the SPMD loop each Ray Train worker runs), fit (one Ray Train run per attempt,
# rerun on whole slices), checkpoints (Orbax: sharded, asynchronous, committed whole).
