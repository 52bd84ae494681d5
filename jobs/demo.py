"""`make demo`: a simulated v6e 4x4 slice, a healthcheck and a short training run, on this machine.

    python -m jobs.demo [--generation v6e --topology 4x4] [--train-steps 12] [--keep-cluster] [--export DIR]

Brings the simulated slice up (`jobs.local`), submits `jobs.healthcheck` and `jobs.train` through
the Ray Jobs API with the repo as working_dir (the path a laptop takes against the GKE cluster's
dashboard), streams their logs, prints a summary and always tears the cluster down. Needs no cloud
account: a few minutes on a 2-core laptop. Exit status 0 when both jobs succeed.

`--export DIR` (what `make serve-demo` runs first) trains on the corpus the repo ships, with its
tokenizer, a model vLLM's CPU backend serves, then writes it to DIR as a Hugging Face model
(`python -m jobs.export`).

`--init-from MODEL --export DIR` (what `make finetune-demo` runs first) fine-tunes MODEL (a Hugging
Face Llama directory: the one `make serve-demo` exports) instead, with `jobs.train --init-from`, on
one short document repeated (jobs.train.loss_check), and exports the result to DIR. It also runs one
step from random parameters on the same data, and computes (in JAX, here) the source model's loss
on the step's batch: the fine-tune's step-1 loss must equal it, the from-scratch one must not.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jobs import cli, local
from jobs.client import jobs_api
from jobs.client.uploads import working_dir_runtime_env
from jobs.runtime.auth import use_environment

# Lines that say nothing to a person watching: 16 per all-reduce set-up on the simulation, Ray
# Train's per-rank report echo, and the machine-readable result lines (the summary shows them).
NOISE = ("[Gloo] Rank", "Reporting training result", "HEALTHCHECK {", "TRAIN {")


@dataclass(frozen=True)
class JobOutcome:
    name: str
    job_id: str
    status: str
    seconds: float
    result: dict | None  # the job's `NAME {json}` line

    @property
    def ok(self) -> bool:
        return self.status == "SUCCEEDED" and self.result is not None and self.result.get("ok", True)


def job_runtime_env(shape) -> dict:
    """The runtime env a laptop would submit with: the repo, and JAX on CPU for the simulation."""
    return working_dir_runtime_env(local.cpu_jax_env(shape))


def run_job(client, name: str, entrypoint: str, runtime_env: dict, marker: str, timeout_s: float, echo) -> JobOutcome:
    """Submit, stream the logs until the job ends (bounded: stopped after `timeout_s`, or when the
    dashboard stalls), parse the result. Ctrl-C stops the job: the cluster is about to go away."""
    started = time.monotonic()
    job_id = jobs_api.submit_job(client, entrypoint, runtime_env, submission_id=f"demo-{name}-{uuid.uuid4().hex[:6]}")

    def show(text: str) -> None:
        for line in text.splitlines():
            if line.strip() and not any(n in line for n in NOISE):
                echo(f"[{name}] {line}")

    try:
        status, logs = jobs_api.follow_job(client, job_id, timeout_s, show, stop_on_interrupt=True)
    except jobs_api.JobTimedOut as err:
        status, logs = f"TIMED OUT: {err}", err.logs
    return JobOutcome(name, job_id, status, time.monotonic() - started, cli.parse_result(logs, marker))


EXPORT_DATA = "jobs/train/assets/corpus.jsonl"  # relative: the job runs in the uploaded working dir
# The fine-tune's step-1 loss equals the source model's on its batch up to float32 summation order
# (16 devices vs one); a from-scratch run's is farther than this from it.
LOSS_RTOL, SCRATCH_MIN_GAP = 1e-4, 0.05


@dataclass(frozen=True)
class FineTune:
    """What `--init-from` sets up: the source, the corpus, the flags of the fine-tune and of the
    from-scratch run, and the source model's loss on the batch every step reads."""

    source: Path
    train_flags: str
    scratch_flags: str
    source_loss: float

    def verdict(self, tuned: JobOutcome | None, scratch: JobOutcome | None) -> tuple[bool, str]:
        """Whether the step-1 losses say what they must, and the line that says it."""
        first = lambda job: (job.result or {}).get("first_loss") if job and job.ok else None  # noqa: E731
        a, b, c = first(tuned), self.source_loss, first(scratch)
        if a is None or c is None:
            return False, "a run did not finish"
        ok = abs(a - b) <= LOSS_RTOL * max(1.0, abs(b)) and abs(c - b) > SCRATCH_MIN_GAP
        return ok, f"fine-tune {a:.5f} = source model {b:.5f} on that batch; from scratch {c:.5f}"


def fine_tune(init_from: str, corpus: Path) -> FineTune:
    """The fine-tune of the Hugging Face directory `init_from` on a repeated document written to
    `corpus` (absolute paths: the simulated hosts share this machine's files)."""
    from jobs.train import hf, hf_import, loss_check, text

    source = Path(init_from).resolve()
    cfg, _ = hf.parse_config(hf_import.read_config(str(source)))
    tokenizer = source / hf_import.TOKENIZER_FILE
    _, tok = text.load_tokenizer(str(tokenizer))
    document, seq_len, row = loss_check.repeated_row(tok, text.eos_id(tok, str(tokenizer)), cfg.seq_len)
    loss_check.write_corpus(corpus, document)
    data = f"--data {corpus} --seq-len {seq_len} --batch-size 32"
    shape = f"--d-model {cfg.d_model} --layers {cfg.n_layers} --heads {cfg.n_heads} --kv-heads {cfg.n_kv_heads} --d-ff {cfg.d_ff} --vocab {cfg.vocab}"
    return FineTune(
        source=source,
        train_flags=f"--init-from {source} {data} --warmup-steps 3 --learning-rate 0.002",
        scratch_flags=f"--tokenizer {tokenizer} {shape} {data} --warmup-steps 1",
        source_loss=loss_check.source_loss(str(source), row),
    )


def export_run(storage_path: str, run: str, out: str, echo) -> bool:
    """`python -m jobs.export` of the run, its output echoed; whether it succeeded."""
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.export", "--storage", storage_path, "--name", run, "--out", out],
        capture_output=True,
        text=True,
        timeout=600,
    )
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.strip() and not line.startswith("EXPORT {"):
            echo(f"[export] {line}")
    return proc.returncode == 0


def auth_check(cluster: local.LocalCluster) -> str:
    """What the slice does with a Jobs API request that carries no token (it must refuse it, as a
    cluster on GKE does), and where its token is."""
    import requests

    token = Path(cluster.state_dir) / local.TOKEN_FILE
    try:
        code = requests.get(f"{cluster.dashboard_url}/api/jobs/", timeout=10).status_code
    except requests.RequestException as err:
        return f"FAILED: {type(err).__name__}"
    verdict = "on" if code == 401 else f"OFF (HTTP {code} without a token)"
    return f"{verdict}: a request without the token gets {code}; token in {token} (mode {token.stat().st_mode & 0o777:o})"


def _summary_table(
    hc: JobOutcome | None,
    tr: JobOutcome | None,
    timings: dict[str, float],
    auth: str | None = None,
    exported: tuple[str, bool] | None = None,
    losses: tuple[bool, str] | None = None,
):
    from rich.table import Table

    table = Table(title="demo summary", show_header=True)
    table.add_column("step")
    table.add_column("status")
    table.add_column("details")
    table.add_row("local slice up", "ok" if "up" in timings else "FAILED", f"{timings.get('up', 0):.0f} s")
    if auth is not None:
        table.add_row("token auth", "ok" if auth.startswith("on") else "FAILED", auth)
    if hc:
        r = hc.result or {}
        details = (
            f"{r.get('hosts')} hosts, {r.get('devices')} devices, sum {'correct' if r.get('correct') else 'WRONG'}, "
            f"latency {r.get('latency_s', 0) * 1e3:.1f} ms, bus bw {r.get('bus_bandwidth_bytes_per_s', 0) / 1e9:.3f} GB/s"
            if r
            else "no result"
        )
        table.add_row("healthcheck job", hc.status, f"{details} ({hc.seconds:.0f} s)")
    if tr:
        r = tr.result or {}
        details = (
            f"steps {r.get('start_step')}->{r.get('steps')}, loss {r.get('first_loss', 0):.3f}->{r.get('final_loss', 0):.3f}, "
            f"step {r.get('step_time_s', 0) * 1e3:.0f} ms, {r.get('tokens_per_s', 0):,.0f} tok/s, "
            f"{r.get('flops_per_s', 0) / 1e9:.2f} GFLOP/s, MFU {'n/a (CPU)' if r.get('mfu') is None else format(r['mfu'], '.1%')}"
            if r
            else "no result"
        )
        table.add_row("train job", tr.status, f"{details} ({tr.seconds:.0f} s)")
    if losses is not None:
        table.add_row("step-1 loss", "ok" if losses[0] else "FAILED", losses[1])
    if exported is not None:
        table.add_row("export", "ok" if exported[1] else "FAILED", exported[0])
    if "down" in timings:
        table.add_row("local slice down", "ok", f"{timings['down']:.0f} s")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    parser = cli.JobArgumentParser(prog="python -m jobs.demo", description=__doc__.split("\n\n")[0])
    cli.add_slice_flags(parser)
    parser.set_defaults(generation="v6e", topology="4x4", slices=1, reserve_timeout=120.0)
    parser.add_argument("--train-steps", type=cli.positive_int, default=12)
    parser.add_argument("--job-timeout", type=cli.positive_seconds, default=600.0, metavar="SECONDS")
    parser.add_argument("--state-dir", default=str(local.DEFAULT_STATE_DIR))
    parser.add_argument("--keep-cluster", action="store_true", help="leave the simulated slice running")
    parser.add_argument("--export", default=None, metavar="DIR", help="train on the shipped corpus and export the model to DIR")
    parser.add_argument(
        "--init-from", default=None, metavar="MODEL", help="with --export: fine-tune this Hugging Face Llama directory instead"
    )
    args, target = cli.parse(parser, argv)
    problem = local.state_dir_problem(args.state_dir)
    if problem:  # a bad flag: say so before anything starts
        parser.error(f"argument --state-dir: {problem}")
    if args.init_from and not args.export:
        parser.error("argument --init-from: needs --export DIR (where the fine-tuned model goes)")
    if args.init_from and not (Path(args.init_from) / "config.json").is_file():
        parser.error(f"argument --init-from: {args.init_from} has no config.json (`make serve-demo` exports one)")
    tune = None
    if args.init_from:  # before anything starts: a model that does not import is a bad flag
        try:
            tune = fine_tune(args.init_from, Path(args.export).resolve().parent / "finetune-corpus.jsonl")
        except (ValueError, OSError) as err:  # HFConfigError, HFImportError, DataError are ValueErrors
            parser.error(f"argument --init-from: {err}")
    use_environment(local.ray_env(Path(args.state_dir).resolve()))  # for the Jobs client too
    console = Console()
    shape = target.shape
    flags = f"--generation {shape.generation.name} --topology {shape.topology} --slices {target.slices} --reserve-timeout {target.reserve_timeout_s:.0f}"
    timings: dict[str, float] = {}
    hc = tr = scratch = None
    exported: bool | None = None
    losses = None
    cluster = None
    auth: str | None = None
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
            step = bar.add_task(f"bringing up {target.describe()}", total=target.hosts + 1)
            started = time.monotonic()
            cluster = local.up(
                shape,
                target.slices,
                args.state_dir,
                progress=lambda message: bar.update(step, advance=1, description=message),
            )
            bar.update(step, completed=target.hosts + 1, description="simulated slice is up")
            timings["up"] = time.monotonic() - started
        auth = auth_check(cluster)
        client = jobs_api.bounded_client(cluster.dashboard_url)
        runtime_env = job_runtime_env(shape)
        echo = lambda line: console.print(line, markup=False, highlight=False)  # noqa: E731
        console.rule(f"healthcheck via the Ray Jobs API at {cluster.dashboard_url}")
        hc = run_job(client, "healthcheck", f"python -m jobs.healthcheck {flags}", runtime_env, "HEALTHCHECK", args.job_timeout, echo)
        console.rule("train")
        run = f"demo-{uuid.uuid4().hex[:6]}"
        train_flags = f"{flags} --steps {args.train_steps} --checkpoint-every {max(1, args.train_steps // 2)} --name {run} "
        if tune is not None:
            train_flags += tune.train_flags
        elif args.export:  # real text, and a head dim vLLM's CPU attention takes (the tiny preset's 64)
            train_flags += f"--data {EXPORT_DATA} --seq-len 128 --batch-size 32 --warmup-steps 3 --learning-rate 0.005"
        else:
            train_flags += "--d-model 64 --layers 2 --seq-len 32 --batch-size 32 --warmup-steps 2 --learning-rate 0.01"
        tr = run_job(client, "train", f"python -m jobs.train {train_flags}", runtime_env, "TRAIN", args.job_timeout, echo)
        if tune is not None:
            console.rule("one step from random parameters, on the same data")
            scratch_flags = f"{flags} --steps 1 --name {run}-scratch {tune.scratch_flags}"
            scratch = run_job(client, "scratch", f"python -m jobs.train {scratch_flags}", runtime_env, "TRAIN", args.job_timeout, echo)
            losses = tune.verdict(tr, scratch)
        if args.export and tr.ok:
            console.rule(f"export to {args.export}")
            exported = export_run(cluster.storage_path, run, args.export, echo)
    except local.LocalClusterError as err:
        console.print(f"[red]could not start the simulated slice:[/red] {err}")
        return 1
    except jobs_api.SubmitError as err:  # the Jobs API stalled or refused a submission
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 1
    finally:
        if cluster is not None and not args.keep_cluster:
            with console.status("tearing the simulated slice down"):
                started = time.monotonic()
                local.down(args.state_dir)
                timings["down"] = time.monotonic() - started
        console.print(_summary_table(hc, tr, timings, auth, (args.export, exported) if exported is not None else None, losses))
    if args.keep_cluster and cluster is not None:
        console.print(f"cluster left running at {cluster.dashboard_url}; `python -m jobs.local down --state-dir {args.state_dir}` stops it")
    ok = hc and tr and hc.ok and tr.ok and auth is not None and auth.startswith("on")
    ok = ok and (losses is None or losses[0])
    return 0 if ok and exported is not False and (exported or not args.export) else 1


if __name__ == "__main__":
    sys.exit(main())
