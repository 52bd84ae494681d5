"""Benchmark of losing a host (`make bench`): how long from the fault to training again, and what it
cost in the run's goodput ledger, with a cold and a warm persistent compilation cache, with and
without a preemption notice, and on an elastic run that keeps training on the slice it has left.

    python bench/restart_bench.py [--steps 16] [--every 4]

On two simulated v4 2x2x2 slices (tests/jobs/sim.py: two hosts each, so a run on both has the four
hosts a v6e 4x4 run has; the GCS's health checks as the manifests set them, infra.disruption),
`jobs.train --slices 2` runs (in this process, as its driver does) until its first committed
checkpoint, and then, each run on its own:

1. cold: host 1 of slice b SIGKILLed (a host lost with no notice) and back at once, no compilation
   cache: the rerun compiles its step again. Its first attempt's start -> first step is the cold
   start-up every target is measured against.
2. warm: the same with a warm cache (the first attempt writes the step's executable).
3. preempted: the host gets a preemption notice instead (`jobs.local kill-host --notice`'s
   mechanism, a 12 s drain as the TPU pods' window allows), then comes back at once: the workers save
   the step they are at inside the notice and the rerun resumes there.
4. elastic (`--min-slices 1`): the host gets the same notice and comes back 15 s after its kill;
   the run goes on on slice a alone (two micro-batches a step), then grows back to both at a step
   boundary.

Each prints fault -> detected -> reserved -> workers up -> restored -> training again, the progress
lost, and the ledger's goodput and badput; then the targets, each on a line ending in `met` or
`NOT met`, and the health checks' false deaths under this load (every node that died that the bench
did not kill).

On this simulation only process 0 finds the step in the cache: JAX's cache key hashes the devices'
topology (jax/_src/cache_key.py `_hash_accelerator_config`, lines 232-245, jax 0.10.2), and the CPU
client's topology is each process's own devices, so hosts 1-3 look up keys that process 0 (the
only writer, compiler.py line 802) never wrote, and compile. On a slice, the TPU client describes
the whole slice's topology on every host, so every host reads process 0's entry. The compile target
reads rank 0's compile, the one the cache serves here as on a slice.
Submit -> step 1 against a bare launch is bench/jobs_bench.py's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from jobs_bench import MODEL_FLAGS  # noqa: E402  (the same model as the start-up bench)

from bench.verdict import verdict  # noqa: E402

SLICES = ("bench-v4-a", "bench-v4-b")
FAULTED = (SLICES[1], 1)  # the host every run loses
NOTICE_S = 12.0  # infra.disruption.TPU_POD_SHUTDOWN.drain_s: what a preempted TPU pod's drain gives
ELASTIC_BACK_AFTER_S = 15.0
TIMEOUT_S = 600.0


def committed_step(run_dir: Path) -> int:
    """The newest committed checkpoint's step (Orbax marks a commit with commit_success.txt)."""
    from jobs.train import checkpoints

    steps = [checkpoints.step_of(m.parent.name) or 0 for m in run_dir.glob(f"{checkpoints.STEP_PREFIX}_*/commit_success.txt")]
    return max(steps, default=0)


def lose_a_host(sim: Any, shape: Any, storage: Path, name: str, cache: str, steps: int, every: int, fault: str) -> dict[str, Any]:
    """One run on both slices that loses host FAULTED after its first committed checkpoint: `fault`
    is "kill" (SIGKILL), "notice" (a preemption notice) or "elastic" (a notice to a --min-slices 1
    run, the host back later); its milestones and ledger."""
    from jobs.runtime import goodput, ledger
    from jobs.train import config as train_config
    from jobs.train import fit as train_fit
    from tests.jobs.sim import SimHost

    argv = [
        *("--generation", shape.generation.name, "--topology", shape.topology, "--slices", "2", "--name", name),
        *("--storage", str(storage), "--steps", str(steps), "--checkpoint-every", str(every), "--max-preemptions", "1"),
        *("--reserve-timeout", "120", "--compilation-cache", cache, "--learning-rate", "0.01", "--warmup-steps", "1"),
        *(("--min-slices", "1", "--resize-check", "5") if fault == "elastic" else ()),
        *MODEL_FLAGS,
    ]
    target, config, run, storage_path, budget = train_config.parse_config(argv)
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["report"] = train_fit.run_training(
                target, config, run, storage_path, budget, log=lambda line: print(f"[{name}] {line}")
            )
        except BaseException as err:  # reported below
            outcome["error"] = err

    runner = threading.Thread(target=fit, daemon=True)
    runner.start()
    run_dir = storage / name
    deadline = time.monotonic() + TIMEOUT_S
    while committed_step(run_dir) < every and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not runner.is_alive() or committed_step(run_dir) < every:
        raise RuntimeError(f"{name}: no committed checkpoint to lose a host after ({outcome})")
    host = SimHost(shape, *FAULTED)
    killed_at = time.time()
    if fault == "kill":
        sim.kill_host(*FAULTED)
        sim.add_host(host)  # GKE recreates the VM
    else:
        sim.preempt_host(host, NOTICE_S, back_after_s=ELASTIC_BACK_AFTER_S if fault == "elastic" else 0.0)
    runner.join(TIMEOUT_S)
    report = outcome.get("report")
    if runner.is_alive() or report is None or not report.ok:
        raise RuntimeError(f"{name}: the run did not end well: {report.describe() if report else outcome}")
    events = ledger.read_events(ledger.ledger_uri(str(run_dir)))
    account = goodput.account(events)
    return {"events": events, "account": account, "killed_at": killed_at, "milestones": milestones(events, killed_at), "report": report}


def milestones(events: list[dict[str, Any]], killed_at: float) -> dict[str, float]:
    """Seconds from the kill to each step of the recovery, and the run's cold start-up and compiles."""

    def first(event: str, attempt: int) -> dict[str, Any]:
        return next(e for e in events if e["event"] == event and e["attempt"] == attempt)

    def steps(attempt: int) -> list[float]:
        return [e["seconds"] for e in events if e["event"] == "step" and e["attempt"] == attempt]

    def compile_stage(attempt: int) -> float:  # XLA's compile or the cache's read, tracing and lowering apart
        c = first("compiled", attempt)
        return float(c["seconds"]) - float(c.get("lower_s", 0.0))

    def first_step_extra(attempt: int) -> float:
        s = steps(attempt)
        return s[0] - statistics.median(s[1:]) if len(s) > 1 else 0.0

    restored = int(first("restored", 2)["step"])
    last = max(e["attempt"] for e in events)
    return {
        # When the first attempt's fit() ended: Ray Train's run failing, or (a notice) returning.
        "noticed": next(e for e in events if e["event"] in ("fit_failed", "attempt_end") and e["attempt"] == 1)["t"] - killed_at,
        "detected": first("attempt_end", 1)["t"] - killed_at,
        "reserved": first("reserved", 2)["t"] - killed_at,
        "workers_up": first("workers_started", 2)["t"] - killed_at,
        "restored": first("restored", 2)["t"] - killed_at,
        "training_again": first("step", 2)["t"] - killed_at,
        "cold_start": first("step", 1)["t"] - first("attempt_start", 1)["t"],
        "compile_1": compile_stage(1),
        "compile_2": compile_stage(2),
        "lower_2": float(first("compiled", 2).get("lower_s", 0.0)),
        "compile_wait_2": first("compiled", 2)["wait_s"],
        "first_step_extra_2": first_step_extra(2),
        "restored_step": float(first("restored", 2)["step"]),
        "cache_hits_2": float(first("compiled", 2)["cache_hits"]),
        "hit_hosts_2": float(first("step", 2).get("hit_hosts", 0)),
        "hosts": float(first("step", 2).get("hosts", 0)),
        "wasted_steps": float(sum(1 for e in events if e["event"] == "step" and e["attempt"] == 1 and e["step"] > restored)),
        "worker_group_2": first("workers_started", 2)["t"] - first("reserved", 2)["t"],
        "slices_2": float(first("attempt_start", 2).get("slices", 0)),
        "slices_last": float(first("attempt_start", last).get("slices", 0)),
        "back_on_all": first("step", last)["t"] - killed_at,
        "random_inits": float(sum(1 for e in events if e["event"] == "initialized" and e.get("how") == "random")),
    }


def describe(label: str, result: dict[str, Any]) -> str:
    from jobs.runtime.goodput import BadputType

    m, account = result["milestones"], result["account"]
    lost = account.badput_s[BadputType.WASTED_PROGRESS_FROM_DISRUPTION]
    return "\n".join(
        [
            f"{label}: kill -> Ray Train's run failed {m['noticed']:.1f} s -> detected (a lost host) {m['detected']:.1f} s -> reserved {m['reserved']:.1f} s -> workers up {m['workers_up']:.1f} s "
            f"-> restored (step {m['restored_step']:.0f}) {m['restored']:.1f} s -> training again {m['training_again']:.1f} s",
            f"  progress lost {lost:.1f} s of steps; rerun's step on rank 0: traced and lowered {m['lower_2']:.1f} s, compiled "
            f"{m['compile_2']:.1f} s ({m['cache_hits_2']:.0f} cache hits; {m['compile_wait_2']:.1f} s of both not hidden by the restore), "
            f"first attempt's compile {m['compile_1']:.1f} s; the rerun's first "
            f"step {m['first_step_extra_2']:.1f} s over its median; the step from the cache on {m['hit_hosts_2']:.0f} of {m['hosts']:.0f} hosts; "
            f"cold start-up {m['cold_start']:.1f} s",
            *("  " + line for line in account.describe().splitlines()),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/restart_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    args = parser.parse_args(argv)

    import ray

    from infra import catalog, disruption
    from jobs.local.env import write_token
    from tests.jobs.sim import patched_environ, set_test_token, simulated_cluster, slice_hosts, use_test_token

    shape = catalog.shape("v4", "2x2x2")
    # Short: Ray's unix socket paths under it must stay under 108 bytes.
    tmp = tempfile.mkdtemp(prefix="restart-", dir="/tmp")
    work = REPO_ROOT / "build" / "restart-bench"
    shutil.rmtree(work, ignore_errors=True)
    settings = {
        "RAY_TMPDIR": tmp,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={shape.jax_devices_per_host}",
        "RAY_AUTH_MODE": "token",
    }
    results = {}
    started = time.monotonic()
    try:
        with patched_environ(settings):
            set_test_token(write_token(tmp))
            use_test_token()
            hosts = [h for name in SLICES for h in slice_hosts(shape, name)]
            with simulated_cluster(hosts, system_config=disruption.HEALTH.system_config()) as sim:
                cache_dir = str(work / "xla-cache")
                for label, cache, fault in (
                    ("cold", "none", "kill"),
                    ("warm", cache_dir, "kill"),
                    ("preempted", cache_dir, "notice"),
                    ("elastic", cache_dir, "elastic"),
                ):
                    print(f"[bench] {label}: {fault} host {FAULTED[1]} of {FAULTED[0]} after the first checkpoint", flush=True)
                    results[label] = lose_a_host(sim, shape, work / "runs", f"restart-{label}", cache, args.steps, args.every, fault)
                faults = 1 + 1 + 1 + 1  # one host lost per run: every other death is a false one
                deaths = sum(1 for n in ray.nodes() if not n["Alive"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    minutes = (time.monotonic() - started) / 60

    cold, warm, noticed, grown = (results[k] for k in ("cold", "warm", "preempted", "elastic"))
    cold_start = cold["milestones"]["cold_start"]
    print()
    print(
        f"restart benchmark on 2 simulated {shape} slices (JAX on CPU, {os.cpu_count()} cores), {args.steps} steps, checkpoint every "
        f"{args.every}; health checks {disruption.HEALTH}"
    )
    print(describe("cold cache, SIGKILL", cold))
    print(describe("warm cache, SIGKILL", warm))
    print(describe(f"warm cache, a {NOTICE_S:g} s preemption notice", noticed))
    print(
        describe(
            f"warm cache, a {NOTICE_S:g} s notice to an elastic run (--min-slices 1), the host back after {ELASTIC_BACK_AFTER_S:g} s", grown
        )
    )
    print(f"{'metric':58} {'ours':>8} {'baseline':>8} {'ratio':>8}  target  verdict")
    wasted = noticed["milestones"]["wasted_steps"]
    print(
        f"{'preempted with a notice: steps wasted (at most 1)':58} {wasted:8.0f} {'':8} {'':8}  <= 1     {'met' if wasted <= 1 else 'NOT met'}"
    )
    print(
        verdict(
            "preempted with a notice: disruption badput vs cold start-up (s)", noticed["account"].disruption_badput_s(), cold_start, 0.5
        )
    )
    print(verdict("lost with no notice, warm: training again vs cold start-up (s)", warm["milestones"]["training_again"], cold_start, 0.7))
    print(verdict("elastic, one slice lost: training on the one left vs cold (s)", grown["milestones"]["training_again"], cold_start, 0.5))
    m = grown["milestones"]
    back = m["slices_2"] == 1 and m["slices_last"] == 2 and m["random_inits"] == 1
    print(
        f"{'elastic: on 1 slice, back on 2, no random init after attempt 1':58} {m['slices_2']:8.0f} {m['slices_last']:8.0f} "
        f"{m['random_inits']:8.0f}  1,2,1    {'met' if back else 'NOT met'}"
    )
    print(
        verdict(
            "rerun's first-step compile, warm vs cold cache (s)",  # the stage the cache serves
            max(0.0, warm["milestones"]["compile_2"]),
            cold["milestones"]["compile_2"],
            0.2,
        )
    )
    print(verdict("disruption badput vs cold start-up, SIGKILL, warm (s)", warm["account"].disruption_badput_s(), cold_start, 1.0))
    print(
        f"context: Ray Train's floor beside the elastic line: its new worker group alone took {m['worker_group_2']:.1f} s, "
        f"{m['worker_group_2'] / cold_start:.2f}x of the cold start-up; back on both slices {m['back_on_all']:.1f} s after the notice"
    )
    w = warm["milestones"]
    print(
        f"context: the lost host (SIGKILL) declared dead {w['detected']:.1f} s after the kill with the manifests' health checks "
        f"(at most {disruption.HEALTH.declared_dead_within_s():g} s by their settings; Ray's defaults took 13.2 s in the last bench "
        f"before them); Ray Train's worker-group start {w['worker_group_2']:.1f} s"
    )
    print(
        f"context: false deaths under load: {deaths - faults} node(s) declared dead that no fault killed, in {minutes:.1f} minutes of "
        f"training on {os.cpu_count()} cores ({len(hosts)} hosts, the GCS's checks every {disruption.HEALTH.period_ms} ms, "
        f"{disruption.HEALTH.failure_threshold} misses of {disruption.HEALTH.timeout_ms} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
