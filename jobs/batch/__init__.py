"""Batch inference on whole slices: a dataset of prompts through vLLM with Ray Data's LLM processor,
resumable and exact.

    python -m jobs.batch --model DIR|gs://...|HF-id --data PATH --output DIR [--prompt-field F]
        [--max-tokens N] [--temperature T] [--env ENV | --generation G --topology T --slices N]

Reads the prompts (parquet, JSON lines or .txt; a file or a directory; local or gs://:
jobs.batch.prompts) on the driver, splits them into shards of `--shard-rows`, and runs the shards
not yet in `--output` through Ray Data's LLM processor (`ray.data.llm`): raw text to the engine, no
chat template, as `vllm.LLM.generate(list_of_str)` takes it. Each shard is committed whole once all
its rows are back (jobs.batch.shards), as parquet with `id` (the input's own, else the row's index),
`prompt`, `completion`, `prompt_tokens`, `completion_tokens` and `finish_reason`. A rerun with the same
`--output` skips the committed shards; a lost host costs the shards in flight (the run exits 1, and
the rerun finishes it), never a row twice.

Submitted to a cluster (`RAY_ADDRESS` set, as `ray job submit` and a RayJob set it) it reserves the
environment's slices whole and puts one engine on each host (jobs.batch.engine says why); with no
`RAY_ADDRESS` it starts a local Ray with one CPU engine, so `.venv-serve/bin/python -m jobs.batch`
works on a laptop. Bad input is refused before Ray or vLLM starts: one line, exit 2, nothing written.
Exit status: 0 done, 1 failed (rerun to finish), 2 bad flags or input.
"""

from typing import Any


def parse_args(argv: Any) -> Any:
    """What jobs.submit checks a batch job's arguments with (on the laptop: nothing read)."""
    from jobs.batch.__main__ import parse_args as parse

    return parse(argv)
