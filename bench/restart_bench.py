"""Benchmark of losing a host (`make bench`): how long from the kill to training again, what it cost
in the run's goodput ledger, with a cold and a warm persistent compilation cache.

    python bench/restart_bench.py [--steps 16] [--every 4]

On a simulated v6e 4x4 (tests/jobs/sim.py: a raylet per host, killed and re-added), `jobs.train`
runs (in this process, as its driver does) until its first committed checkpoint; then host 2 is
SIGKILLed and comes back at once as a re-provisioned node would, and the run reruns on the whole
slice. Twice: with no compilation cache (cold: the rerun compiles its step again) and with a fresh
cache (warm: the first attempt writes the step's executable, the rerun reads it); then once more
warm with the host SIGTERMed instead, as a preempted GKE node's pods are on its notice (its raylet
leaves the cluster, so Ray knows at once rather than after missed health checks). Each prints
kill -> detected -> reserved -> workers up -> restored -> training again (the rerun's first step
done), the progress lost, and the ledger's goodput and badput.

On this simulation only process 0 finds the step in the cache: JAX's cache key hashes the devices'
topology (jax/_src/cache_key.py `_hash_accelerator_config`, lines 232-245, jax 0.10.2), and the CPU
client's topology is each process's own devices, so hosts 1-3 look up keys that process 0 (the
only writer, compiler.py line 802) never wrote, and compile. On a slice, the TPU client describes
the whole slice's topology on every host, so every host reads process 0's entry (JAX's guide puts
the cache in GCS for that; libtpu's side cannot be read or run here). The warm rerun's first step
therefore waits for three hosts' compiles here ("the rerun's first step ... over its median"), and
the compile target below reads rank 0's compile, the one the cache serves here as on a slice.

Targets, each on a line of its own ending in `met` or `NOT met`:
1. lost host -> every host training again, warm cache, against the cold run's start -> first step
   done (its cold start-up, compile included): <= 0.5x.
2. the rerun's first-step compile (the step's AOT compile, or its executable read from the
   cache), warm against cold: <= 0.2x. JAX's stages: tracing and lowering come first, and no
   cache saves them (the compilation cache is looked up in `Lowered.compile`); they are printed
   beside it.
3. the badput of the disruption (infrastructure recovery + wasted progress, from the ledger),
   warm, against the cold start-up of the same run (attempt 1's start -> first step done): <= 1.0x.
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

KILLED_WORKER = 2
TIMEOUT_S = 600.0


def committed_step(run_dir: Path) -> int:
    """The newest committed checkpoint's step (Orbax marks a commit with commit_success.txt)."""
    from jobs.train import checkpoints

    steps = [checkpoints.step_of(m.parent.name) or 0 for m in run_dir.glob(f"{checkpoints.STEP_PREFIX}_*/commit_success.txt")]
    return max(steps, default=0)


def lose_a_host(
    sim: Any, shape: Any, slice_name: str, storage: Path, name: str, cache: str, steps: int, every: int, preempted: bool = False
) -> dict[str, Any]:
    """One run that loses host 2 after its first committed checkpoint (SIGKILLed, or `preempted`:
    SIGTERMed, as on a preemption notice); its milestones and ledger."""
    from jobs.runtime import goodput, ledger
    from jobs.train import config as train_config
    from jobs.train import fit as train_fit
    from tests.jobs.sim import SimHost

    argv = [
        *("--generation", shape.generation.name, "--topology", shape.topology, "--name", name, "--storage", str(storage)),
        *("--steps", str(steps), "--checkpoint-every", str(every), "--max-preemptions", "1", "--reserve-timeout", "120"),
        *("--compilation-cache", cache, "--learning-rate", "0.01", "--warmup-steps", "1"),
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
    killed_at = time.time()
    sim.kill_host(slice_name, KILLED_WORKER, graceful=preempted)
    sim.add_host(SimHost(shape, slice_name, KILLED_WORKER))  # GKE recreates the VM
    runner.join(TIMEOUT_S)
    report = outcome.get("report")
    if runner.is_alive() or report is None or not report.ok or len(report.attempts) != 2:
        raise RuntimeError(f"{name}: the run did not end in two attempts: {report.describe() if report else outcome}")
    events = ledger.read_events(ledger.ledger_uri(str(run_dir)))
    account = goodput.account(events)
    return {"events": events, "account": account, "killed_at": killed_at, "milestones": milestones(events, killed_at)}


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

    return {
        "noticed": first("fit_failed", 1)["t"] - killed_at,
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


def verdict(name: str, ours: float, base: float, target: float, at_most: bool = True) -> str:
    ratio = ours / base if base > 0 else float("inf")
    met = ratio <= target if at_most else ratio >= target
    return f"{name:58} {ours:8.2f} {base:8.2f} {ratio:7.2f}x {'<=' if at_most else '>='} {target}x  {'met' if met else 'NOT met'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/restart_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    args = parser.parse_args(argv)

    from infra import catalog
    from jobs.local.env import write_token
    from tests.jobs.sim import patched_environ, set_test_token, simulated_cluster, slice_hosts, use_test_token

    shape = catalog.shape("v6e", "4x4")
    slice_name = "bench-4x4"
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
    try:
        with patched_environ(settings):
            set_test_token(write_token(tmp))
            use_test_token()
            with simulated_cluster(slice_hosts(shape, slice_name)) as sim:
                cache_dir = str(work / "xla-cache")
                for label, cache, preempted in (("cold", "none", False), ("warm", cache_dir, False), ("preempted", cache_dir, True)):
                    how = "SIGTERM, as on a preemption notice" if preempted else "SIGKILL"
                    print(f"[bench] {label}: lose host {KILLED_WORKER} ({how}) after the first checkpoint", flush=True)
                    results[label] = lose_a_host(
                        sim, shape, slice_name, work / "runs", f"restart-{label}", cache, args.steps, args.every, preempted
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    cold, warm = results["cold"], results["warm"]
    print()
    print(
        f"restart benchmark on a simulated {shape} (JAX on CPU, {os.cpu_count()} cores), {args.steps} steps, checkpoint every {args.every}"
    )
    print(describe("cold cache", cold))
    print(describe("warm cache", warm))
    print(describe("warm cache, the host preempted with notice (SIGTERM: its raylet leaves the cluster)", results["preempted"]))
    print(f"{'metric':58} {'ours':>8} {'baseline':>8} {'ratio':>8}  target  verdict")
    print(
        verdict(
            "lost host -> training again, warm vs cold start-up (s)",
            warm["milestones"]["training_again"],
            cold["milestones"]["cold_start"],
            0.5,
        )
    )
    print(
        verdict(
            "rerun's first-step compile, warm vs cold cache (s)",  # the stage the cache serves
            max(0.0, warm["milestones"]["compile_2"]),
            cold["milestones"]["compile_2"],
            0.2,
        )
    )
    print(
        verdict(
            "disruption badput vs cold start-up, same run (s)", warm["account"].disruption_badput_s(), warm["milestones"]["cold_start"], 1.0
        )
    )
    whole = [r["milestones"]["compile_2"] + r["milestones"]["lower_2"] for r in (warm, cold)]
    print(
        f"context: the rerun's step with its tracing and lowering, warm vs cold: {whole[0]:.2f} s vs {whole[1]:.2f} s = {whole[0] / whole[1]:.2f}x"
    )
    m = warm["milestones"]
    ray_s = m["detected"] + (m["workers_up"] - m["reserved"])
    print(
        f"context: Ray's own share of the warm recovery: the lost node declared dead {m['detected']:.1f} s after the kill (the GCS's "
        f"health checks) + Ray Train's worker-group start {m['workers_up'] - m['reserved']:.1f} s = {ray_s:.1f} s, "
        f"{ray_s / m['cold_start']:.2f}x of the cold start-up before any work of ours"
    )
    p = results["preempted"]["milestones"]
    print(
        f"context: preempted with notice (not a target: the SIGKILL above is the worst case), lost host -> training again "
        f"{p['training_again']:.1f} s, {p['training_again'] / cold['milestones']['cold_start']:.2f}x the cold start-up; "
        f"declared dead after {p['detected']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
