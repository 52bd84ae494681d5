"""Where a served token's CPU goes: `vllm serve` and Ray Serve LLM, one at a time, under the same
load from vLLM's own client; each server's processes' CPU per 1,000 output tokens by role, and
py-spy's hottest Python frames in each role (README "Serving overhead" summarizes a run).

  .venv-serve/bin/python bench/serve_profile.py [--concurrency 4] [--num-prompts 32] [--model small]
      [--rate 50] [--top 6] [--variant NAME:K=V,...] [--json FILE]

Per server: start it (bench/serve_servers.py, as the serve bench does), warm it up, then two loads
of `--num-prompts` requests: the first counts CPU (utime + stime from /proc of every process in the
server's session, before and after), the second runs under `py-spy record --subprocesses
--nonblocking` (py-spy's own CPU would blur the first). Only one server is up at a time: an idle
server's daemons would count against the other. HAProxy and Ray's C++ daemons (raylet, GCS) have
no Python frames; their share shows in the CPU table.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serve_bench import MODELS, RAY, VLLM, model_dir, variant  # noqa: E402
from bench.serve_load import Load, LoadError, probe_usage, run_load  # noqa: E402
from bench.serve_servers import BenchError, Server, cpu_seconds, session_stats, start_ray, start_vllm  # noqa: E402
from jobs.serve.local import MODEL_ID, WORK, apply_offline_environment, local_ray_env  # noqa: E402

PY_SPY = Path(sys.executable).with_name("py-spy")
# A process's role from its command line (Ray titles its workers `ray::<actor class>...`, vLLM its
# engine `VLLM::EngineCore`), first match wins.
ROLES = (
    ("haproxy", "HAProxy"),
    ("OpenAiIngress", "Serve router replica (OpenAI ingress)"),
    ("LLMRouter", "Serve router replica (OpenAI ingress)"),
    ("ServeReplica", "Serve LLM replica (vLLM's API + engine client)"),
    ("EngineCore", "vLLM engine core (scheduler)"),
    ("VLLM::Worker", "vLLM model worker (forward pass)"),
    ("ServeController", "Serve controller"),
    ("ProxyActor", "Serve proxy (Python)"),
    ("raylet", "raylet"),
    ("gcs_server", "GCS"),
    ("vllm_cli.py serve", "vllm serve API server"),
    ("serve_servers.py ray", "Ray driver"),
)
OTHER = "other (Ray's agents and monitors, idle workers)"


def role(cmdline: str) -> str:
    """The role of a process from its command line (pure)."""
    return next((name for key, name in ROLES if key in cmdline), OTHER)


def cpu_by_pid(sid: int) -> dict[int, tuple[str, float]]:
    """(command line, CPU seconds so far) of every process in session `sid`."""
    out = {}
    for pid, fields in session_stats(sid):
        with contextlib.suppress(OSError):  # gone since
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            out[pid] = (cmd, cpu_seconds(fields))
    return out


def cpu_by_role(before: Mapping[int, tuple[str, float]], after: Mapping[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two `cpu_by_pid` snapshots, summed by role (pure); a process that
    started in between counts from zero."""
    spent: dict[str, float] = collections.Counter()
    for pid, (cmd, seconds) in after.items():
        spent[role(cmd)] += seconds - before.get(pid, (cmd, 0.0))[1]
    return dict(spent)


_PROCESS = re.compile(r'^process \d+:"(.*)"$')


def hot_frames(raw_lines: Iterable[str]) -> dict[str, collections.Counter[str]]:
    """py-spy's raw (collapsed) stacks -> per role, samples by leaf frame `function (file)` (pure).
    A line is `process PID:"cmd";[process PID:"cmd";...]frame;...;frame COUNT`; the innermost process
    is the one sampled."""
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw_lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        cmds = [m.group(1) for f in frames if (m := _PROCESS.match(f))]
        code = [f for f in frames if not _PROCESS.match(f)]
        if not cmds or not code:
            continue
        leaf = re.sub(r":\d+\)$", ")", code[-1])  # one entry per function, not per line
        out[role(cmds[-1])][leaf] += int(count)
    return dict(out)


def profile(server: Server, args: argparse.Namespace, path: Path, result_dir: Path) -> dict[str, Any]:
    load = Load(args.concurrency, args.num_prompts, args.input_len, args.output_len)
    probe_usage(server.url, MODEL_ID, args.output_len, timeout_s=args.timeout)
    run_load(server.url, MODEL_ID, path, load, result_dir / f"{server.slug}-warm.json", label=server.name, timeout_s=args.timeout)
    started, before = time.monotonic(), cpu_by_pid(server.proc.pid)
    m = run_load(server.url, MODEL_ID, path, load, result_dir / f"{server.slug}-cpu.json", label=server.name, timeout_s=args.timeout)
    spent = cpu_by_role(before, cpu_by_pid(server.proc.pid))
    window = time.monotonic() - started  # the client's start-up too: the engines spin through it
    tokens = load.num_prompts * load.output_len
    raw = result_dir / f"{server.slug}-py-spy.txt"
    spy = subprocess.Popen(
        [str(PY_SPY), "record", "--pid", str(server.proc.pid), "--subprocesses", "--nonblocking"]
        + ["--rate", str(args.rate), "--format", "raw", "-o", str(raw)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_load(server.url, MODEL_ID, path, load, result_dir / f"{server.slug}-spy.json", label=server.name, timeout_s=args.timeout)
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
    frames = hot_frames(raw.read_text().splitlines()) if raw.is_file() else {}
    return {
        "output_throughput": m["output_throughput"],
        "wall_s": m["duration_s"],
        "window_s": window,
        "cpu_s": spent,
        "cpu_ms_per_1k_tokens": {r: 1000 * 1000 * s / tokens for r, s in spent.items()},
        "frames": {r: c.most_common(args.top) for r, c in frames.items()},
        "samples": {r: sum(c.values()) for r, c in frames.items()},
    }


def report(name: str, p: dict[str, Any], top: int) -> None:
    total = sum(p["cpu_s"].values())
    print(
        f"\n{name}: {p['output_throughput']:.1f} tok/s over {p['wall_s']:.1f} s; CPU {total:.1f} s in all over {p['window_s']:.1f} s with the client's start ({100 * total / p['window_s']:.0f}% of a core)"
    )
    for r, s in sorted(p["cpu_s"].items(), key=lambda kv: -kv[1]):
        if s >= 0.05:
            print(f"  {r:44s}{s:7.2f} s  {p['cpu_ms_per_1k_tokens'][r]:7.0f} ms per 1k tokens")
    for r, frames in sorted(p["frames"].items(), key=lambda kv: -p["samples"][kv[0]]):
        n = p["samples"][r]
        print(f"  py-spy, {r} ({n} samples, not idle): " + "; ".join(f"{f} {100 * c / n:.0f}%" for f, c in frames[:top]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--num-prompts", type=int, default=32, help="requests per load")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=6, help="frames shown per role")
    parser.add_argument("--variant", type=variant, action="append", default=[], help="also profile a Ray Serve LLM with these settings")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.num_prompts < 1 or args.rate < 1:
        parser.error("--concurrency, --num-prompts and --rate must be at least 1")
    if not PY_SPY.is_file():
        parser.error(f"py-spy is not at {PY_SPY} (make serve-setup installs it in .venv-serve)")
    apply_offline_environment()
    path = model_dir(args.model)
    result_dir = WORK / "bench" / "profile"
    result_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    try:
        with start_vllm(path, result_dir, args.timeout) as server:
            results[VLLM] = profile(server, args, path, result_dir)
        for name, env in {RAY: {}, **dict(args.variant)}.items():
            with start_ray(path, result_dir, args.timeout, name, {**local_ray_env(), **env}) as server:
                results[name] = profile(server, args, path, result_dir)
    except (BenchError, LoadError) as err:
        print(f"serve profile: error: {err}", file=sys.stderr)
        return 1
    print(
        f"serve profile: {args.model} model, concurrency {args.concurrency}, {args.num_prompts} requests of {args.input_len} in / {args.output_len} out"
    )
    for name, p in results.items():
        report(name, p, args.top)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
