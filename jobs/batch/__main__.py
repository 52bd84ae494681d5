"""`python -m jobs.batch`: see `jobs.batch`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs import cli
from jobs.batch import engine, shards
from jobs.batch.prompts import BatchInputError, Prompts, read_prompts
from jobs.runtime import storage

DEFAULT_SHARD_ROWS = 256
DEFAULT_MAX_MODEL_LEN = 512
STALL_S = 900.0  # no shard committed for this long while hosts are up: a hang, exit 1
# A host lost: Ray Data retries the lost engine's blocks on the engines left, and restarts that
# engine when the host is back (its bundle is rescheduled). Carry on while rows come back; none for
# this long and the run stops (exit 1), for a rerun to finish.
LOST_STALL_S = 120.0
POLL_S = 1.0
PROGRESS_S = 15.0


def _parser() -> cli.JobArgumentParser:
    p = cli.JobArgumentParser(prog="python -m jobs.batch", description="Push a dataset of prompts through vLLM on whole slices.")
    cli.add_slice_flags(p)
    g = p.add_argument_group("batch")
    g.add_argument("--model", required=True, help="a Hugging Face Llama directory (jobs.export writes one), gs://..., or a Hugging Face id")
    g.add_argument("--data", required=True, metavar="PATH", help="prompts: a parquet / JSON lines / .txt file or directory, local or gs://")
    g.add_argument(
        "--output", required=True, metavar="PATH", help="a directory (local or gs://) for the parquet shards; a rerun finishes it"
    )
    g.add_argument("--prompt-field", default="prompt", metavar="F", help="the prompts' column or field (default: prompt; .txt: every line)")
    g.add_argument("--max-tokens", type=cli.positive_int, default=64, metavar="N", help="tokens per completion at most (default 64)")
    g.add_argument("--temperature", type=_temperature, default=0.0, metavar="T", help="sampling temperature (default 0: greedy)")
    g.add_argument("--shard-rows", type=cli.positive_int, default=DEFAULT_SHARD_ROWS, metavar="N", help="prompts per output shard")
    g.add_argument("--max-model-len", type=cli.positive_int, default=DEFAULT_MAX_MODEL_LEN, metavar="N", help="the engines' context length")
    return p


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; use 0 (greedy) or more") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not allowed; use 0 (greedy) or more")
    return value


def model_problem(model: str) -> str | None:
    """Why `model` is not a Hugging Face Llama directory, or None (an HF id is vLLM's to check)."""
    if not (storage.is_remote(model) or os.path.isdir(model)):
        looks_like_an_id = model.count("/") == 1 and not model.startswith((".", "/", "~")) and not os.path.exists(model)
        return None if looks_like_an_id else f"{model} is not a directory (nor a Hugging Face id such as org/name)"
    try:
        config = json.loads(storage.read_bytes(storage.join(model, "config.json")))
    except (storage.StorageError, json.JSONDecodeError, UnicodeDecodeError) as err:
        return f"{model} has no readable config.json ({err})"
    kind, arch = config.get("model_type"), config.get("architectures") or []
    if kind != "llama" and "LlamaForCausalLM" not in arch:
        return f"{model} is a {kind or 'model of no model_type'} model, not a Llama (a Hugging Face Llama directory, as jobs.export writes)"
    return None


def engine_model_path(model: str) -> str:
    """Where the engines read `model`: a local directory as it is (made absolute), gs:// through the
    cluster's bucket mount (as serving reads it), an HF id as given."""
    from infra.serving import bucket_mount_path, mounted_path

    if storage.is_remote(model):
        return mounted_path(model, bucket_mount_path())
    return str(Path(model).resolve()) if os.path.isdir(model) else model


def mount_problem(model: str) -> str | None:
    """Why the engines could not read a gs:// `model` here, or None: vLLM reads it through the
    bucket's GCS FUSE mount, which the batch RayJob's pods have (infra.manifests.bucket_mount)."""
    from infra.serving import bucket_mount_path

    if not storage.is_remote(model) or os.path.isdir(path := engine_model_path(model)):
        return None
    return (
        f"the engines read {model} through the environment's bucket mounted at {bucket_mount_path()}, and {path} is not there on "
        "this machine: run it as a RayJob (`python -m jobs.submit batch --rayjob`: its pods mount the environment's bucket) "
        "with the model in that bucket, or pass a local directory"
    )


def cpu_offline_env() -> dict[str, str]:
    """A CPU engine's offline settings, as serving's on this machine (jobs.serve.local): vLLM's KV
    cache at 1 GiB (by default its CPU backend claims 92% of the memory), offline, caches under
    build/. (Its process settings, threads and the in-process worker, are the layout's:
    engine.cpu_engine_env.)"""
    from jobs.serve.local import offline_environment

    return {k: v for k, v in offline_environment().items() if not k.startswith("RAY_")}


@dataclass
class Collector:
    """Rows coming back from the engines, committed a shard at a time once all its rows are in."""

    prompts: Prompts
    plan: list[range]
    pending: set[int]
    output: str
    key: shards.RunKey
    rows: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)  # shards committed by this run
    done_rows: int = 0
    tokens: int = 0
    last_commit: float = field(default_factory=time.monotonic)
    last_row: float = field(default_factory=time.monotonic)
    first_row: float | None = None  # when the engines' first row came back
    error: BaseException | None = None
    finished: bool = False

    @property
    def committed(self) -> int:
        return len(self.done)

    def add(self, row: dict[str, Any]) -> None:
        index = int(row["_row"])
        shard = index // self.key.shard_rows
        if shard in self.done:  # a retried block's row of a shard already committed
            return
        got = self.rows.setdefault(shard, {})
        if index in got:  # a retried block: the same row again, kept once
            return
        got[index] = row
        self.last_row = time.monotonic()
        if self.first_row is None:
            self.first_row = self.last_row
        self.done_rows += 1
        self.tokens += int(row["completion_tokens"])
        if len(got) == len(self.plan[shard]):
            self._commit(shard, self.rows.pop(shard))

    def _commit(self, shard: int, got: dict[int, dict[str, Any]]) -> None:
        order = list(self.plan[shard])
        columns = {
            "id": [self.prompts.ids[i] for i in order],
            "prompt": [self.prompts.texts[i] for i in order],
            "completion": [got[i]["completion"] for i in order],
            "prompt_tokens": [int(got[i]["prompt_tokens"]) for i in order],
            "completion_tokens": [int(got[i]["completion_tokens"]) for i in order],
            "finish_reason": [got[i]["finish_reason"] for i in order],
        }
        shards.write_shard(self.output, shard, columns, self.key)
        self.done.add(shard)
        self.last_commit = time.monotonic()


def _progress(c: Collector, total_rows: int, started: float) -> str:
    elapsed = max(time.monotonic() - started, 1e-9)
    rate = c.done_rows / elapsed
    eta = (total_rows - c.done_rows) / rate if rate > 0 else float("inf")
    eta_text = "?" if eta == float("inf") else f"{eta:.0f} s"
    return (
        f"[batch] {c.committed}/{len(c.pending)} shards, {c.done_rows}/{total_rows} rows, {c.tokens / elapsed:.1f} tokens/s, ETA {eta_text}"
    )


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, cli.SliceTarget]:
    """The flags and the slices a batch job asks for, checked as the job will check them (no input
    read: jobs.submit calls this on the laptop)."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    return args, cli.resolve_target(parser, args)


def main(argv: Sequence[str] | None = None) -> int:
    job_started = time.monotonic()
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    on_cluster = bool(os.environ.get("RAY_ADDRESS"))
    target = cli.resolve_target(parser, args) if on_cluster else None
    problem = model_problem(args.model) or mount_problem(args.model)
    if problem:
        parser.error(f"argument --model: {problem}")
    try:
        prompts = read_prompts(args.data, args.prompt_field)
        key = shards.RunKey(args.data, len(prompts), args.shard_rows, args.model, args.max_tokens, args.temperature)
        done = shards.committed(args.output, key)
    except (BatchInputError, shards.OutputError) as err:
        parser.error(str(err))
    plan = shards.plan(len(prompts), args.shard_rows)
    pending = [i for i in range(len(plan)) if i not in done]
    print(f"[batch] {len(prompts)} prompts in {len(plan)} shards of {args.shard_rows}; {len(done)} already committed in {args.output}")
    if not pending:
        print("BATCH " + json.dumps({"rows": len(prompts), "shards": len(plan), "written": 0, "skipped": len(done), "requests": 0}))
        return 0
    shards.clear_leftovers(args.output)
    return _run(args, target, prompts, plan, pending, key, len(done), job_started)


def _run(
    args: argparse.Namespace,
    target: cli.SliceTarget | None,
    prompts: Prompts,
    plan: list[range],
    pending: list[int],
    key,
    skipped: int,
    job_started: float,
) -> int:
    import ray

    # Ray Data's LLM processor (torch, transformers: seconds of CPU): imported while Ray starts.
    warm = threading.Thread(target=_import_processor, daemon=True)
    warm.start()
    if target is None:  # no cluster: a local Ray with one CPU engine, offline (as jobs.serve.local)
        from jobs.serve.local import apply_offline_environment

        apply_offline_environment()
        # Logical CPUs for the pipeline's actors (tokenizer, engine, detokenizer each hold one), as jobs.serve.local.
        ray.init(address="local", num_cpus=max(4, os.cpu_count() or 4), include_dashboard=False, log_to_driver=False)
    else:
        cli.connect_ray()
    from jobs.runtime.labels import alive_of_pod_type
    from jobs.runtime.reservation import reserve_slices

    on_cpu = os.environ.get("JAX_PLATFORMS", "").split(",")[0] == "cpu"  # the simulation's hosts
    layout = engine.layout(
        target.shape if target else None, target.slices if target else 1, on_cpu, args.max_model_len, machine_cores=os.cpu_count() or 1
    )
    rows = [{"_row": i, "prompt": prompts.texts[i]} for s in pending for i in plan[s]]
    collector = Collector(prompts, plan, set(pending), args.output, key)
    started = time.monotonic()
    try:
        with (
            reserve_slices(target.shape, target.slices, target.reserve_timeout_s or cli.DEFAULT_RESERVE_TIMEOUT_S, "batch")
            if target
            else _nothing() as reservation
        ):
            print(
                f"[batch] {layout.describe()}" + (f" on {', '.join(reservation.slice_names)}" if reservation else " on this machine"),
                flush=True,
            )
            warm.join()
            processor = engine.build(
                engine_model_path(args.model),
                layout,
                args.max_tokens,
                args.temperature,
                placement_group=reservation.placement_group if reservation else None,
                env_vars=cpu_offline_env() if layout.accelerator_type is None else None,  # CPU engines
            )
            results = processor(ray.data.from_items(rows, override_num_blocks=engine.input_blocks(len(rows), layout.engines)))

            def consume() -> None:
                try:
                    # Whole blocks as they come (no re-batching), turned into rows by Arrow, not row by row.
                    for block in results.iter_batches(batch_size=None, batch_format="pyarrow"):
                        for row in block.to_pylist():
                            collector.add(row)
                except BaseException as err:  # reported by the loop below
                    collector.error = err
                finally:
                    collector.finished = True

            threading.Thread(target=consume, daemon=True).start()
            hosts = {h.node_id for h in reservation.hosts} if reservation else set()
            last_print = time.monotonic()
            lost: set[str] = set()
            said_first = False
            while not collector.finished:
                time.sleep(POLL_S)
                if collector.first_row is not None and not said_first:
                    print(f"[batch] first rows back {collector.first_row - job_started:.1f} s after the start", flush=True)
                    said_first = True
                if hosts and target:
                    gone = hosts - {n.node_id for n in alive_of_pod_type(ray.nodes(), target.shape.pod_type)}
                    if gone - lost:
                        print(f"[batch] {len(gone)} host(s) of the reservation lost: carrying on with the engines left", flush=True)
                    lost |= gone
                if lost and time.monotonic() - collector.last_row > LOST_STALL_S:
                    raise RuntimeError(f"{len(lost)} host(s) of the reservation were lost and no row came back for {LOST_STALL_S:g} s")
                if time.monotonic() - collector.last_commit > STALL_S:
                    raise TimeoutError(f"no shard committed for {STALL_S:g} s")
                if time.monotonic() - last_print > PROGRESS_S:
                    print(_progress(collector, len(rows), started), flush=True)
                    last_print = time.monotonic()
            if collector.error is not None and collector.committed < len(pending):
                raise collector.error
    except Exception as err:
        print(_progress(collector, len(rows), started), flush=True)
        print(
            f"[batch] error: {str(err).splitlines()[0] if str(err) else type(err).__name__}; {collector.committed} shard(s) committed. "
            "Run the same command again to finish: committed shards are skipped.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)  # the engines' actors and Ray Data's threads must not hold the exit up
    elapsed = time.monotonic() - started
    print(_progress(collector, len(rows), started), flush=True)
    summary = {
        "rows": len(prompts),
        "shards": len(plan),
        "written": collector.committed,
        "skipped": skipped,
        "requests": len(rows),  # prompts sent to the engines: the shards not committed before
        "output_tokens": collector.tokens,
        "seconds": elapsed,
        "tokens_per_s": collector.tokens / elapsed if elapsed > 0 else 0.0,
        "engines": layout.engines,
    }
    print("BATCH " + json.dumps(summary), flush=True)
    ray.shutdown()
    # Every shard is committed and said: no interpreter teardown of torch's, vLLM's and Ray Data's
    # modules and threads (about 2 s on a 2-core machine, waited for by whoever runs it).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _import_processor() -> None:
    try:
        engine.import_processor()
    except Exception:  # engine.build imports it again and reports what is wrong
        pass


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
