"""`python -m jobs.local up | status | down | env | rayjob FILE | preempt | kill-host`: see `jobs.local`,
`jobs.local.rayjob`, `jobs.local.preempt` and `jobs.local.faults`."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from jobs.cli import (
    JobArgumentParser,
    add_slice_flags,
    non_negative_int,
    non_negative_seconds,
    positive_int,
    positive_seconds,
    resolve_target,
)
from jobs.local import rayjob
from jobs.local.cluster import DEFAULT_STATE_DIR, LocalCluster, LocalClusterError, down, status, up
from jobs.local.env import client_exports, state_dir_problem
from jobs.local.faults import FaultError, FaultFlagError, kill_host
from jobs.local.preempt import TIMEOUT_S, PreemptError, preempt
from jobs.local.rayjob_spec import RayJobError, parse_rayjob


def _parser() -> JobArgumentParser:
    parser = JobArgumentParser(
        prog="python -m jobs.local",
        description="A simulated TPU slice on this machine: a real local Ray cluster, one raylet per simulated host.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=JobArgumentParser)
    start = sub.add_parser("up", help="start a simulated slice")
    add_slice_flags(start, reserve_timeout=False)
    start.add_argument("--timeout", type=positive_seconds, default=90.0, metavar="SECONDS", help="per-node start timeout")
    job = sub.add_parser(
        "rayjob",
        help="run a KubeRay RayJob (e.g. `python -m jobs.submit JOB --print-rayjob`) on a simulated slice of its shape, as KubeRay would",
    )
    job.add_argument("file", metavar="FILE", help="the RayJob's YAML (other documents in it are left out); - for stdin")
    job.add_argument("--status-file", metavar="PATH", help="append the RayJob's .status, one JSON line per transition")
    job.add_argument("--log-file", metavar="PATH", help="append the job's logs as they stream")
    job.add_argument(
        "--default-deadline",
        type=positive_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="the bound on the whole run when the RayJob sets no activeDeadlineSeconds (default 3600)",
    )
    job.add_argument("--node-timeout", type=positive_seconds, default=90.0, metavar="SECONDS", help="per-node start timeout")
    for p in (start, job):
        p.add_argument("--host-cpus", type=positive_int, default=2, help="logical CPUs per simulated host")
        p.add_argument("--object-store-mb", type=positive_int, default=128, help="object store per node, MiB")
    evict = sub.add_parser(
        "preempt", help="evict the RayJob `rayjob FILE` runs from this --state-dir, as Kueue does; exits 0 once it is Suspended"
    )
    evict.add_argument(
        "--timeout",
        type=positive_seconds,
        default=TIMEOUT_S,
        metavar="SECONDS",
        help=f"for the eviction to be delivered (default {TIMEOUT_S:g})",
    )
    kill = sub.add_parser(
        "kill-host",
        help="do to one simulated host what GKE does to a preempted node: SIGTERM with --notice as the drain's deadline, "
        "SIGKILL when it runs out (no --notice: SIGKILL at once); exits 0 once the host is signalled",
    )
    kill.add_argument("--slice", type=non_negative_int, required=True, metavar="I", help="the slice, 0-based (as `status` lists them)")
    kill.add_argument(
        "--host", type=non_negative_int, required=True, metavar="J", help="the host in the slice, 0-based (its TPU worker id)"
    )
    kill.add_argument(
        "--notice", type=positive_seconds, default=None, metavar="SECONDS", help="a preemption notice this long (default: none)"
    )
    kill.add_argument(
        "--back-after",
        type=non_negative_seconds,
        default=None,
        metavar="SECONDS",
        help="start a fresh host in its place this long after the kill, in the background, as the node pool re-provisions it",
    )
    for name, text in (
        ("status", "show the simulated slices"),
        ("down", "stop the simulated cluster"),
        ("env", "print the export lines that point `ray job submit` at the cluster (its address and token file)"),
    ):
        sub.add_parser(name, help=text)
    parser.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR), help=f"default: {DEFAULT_STATE_DIR}")
    for p in sub.choices.values():
        # SUPPRESS: a subcommand's copy sets the flag only when given after it, so
        # `--state-dir X up` and `up --state-dir X` both mean X.
        p.add_argument("--state-dir", default=argparse.SUPPRESS, help=f"default: {DEFAULT_STATE_DIR}")
    return parser


def _rayjob(parser: JobArgumentParser, args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        spec = parse_rayjob(text, "stdin" if args.file == "-" else args.file)
    except OSError as err:
        print(f"error: {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    except RayJobError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    problem = state_dir_problem(args.state_dir)
    if problem:
        parser.error(f"argument --state-dir: {problem}")
    with contextlib.ExitStack() as files:
        opened: dict[str, IO[str] | None] = {}
        for flag in ("status_file", "log_file"):
            path = getattr(args, flag)
            try:
                opened[flag] = files.enter_context(open(path, "a")) if path else None
            except OSError as err:
                parser.error(f"argument --{flag.replace('_', '-')}: cannot write {path}: {err.strerror}")
        return rayjob.run(
            spec,
            args.state_dir,
            default_deadline_s=args.default_deadline,
            node_timeout_s=args.node_timeout,
            host_cpus=args.host_cpus,
            object_store_mb=args.object_store_mb,
            status_file=opened["status_file"],
            log_file=opened["log_file"],
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        if args.command == "up":
            target = resolve_target(parser, args)
            problem = state_dir_problem(args.state_dir)
            if problem:  # a bad flag: say so before anything starts
                parser.error(f"argument --state-dir: {problem}")
            started = time.monotonic()
            cluster = up(
                target.shape,
                target.slices,
                args.state_dir,
                node_timeout_s=args.timeout,
                host_cpus=args.host_cpus,
                object_store_mb=args.object_store_mb,
                progress=lambda m: print(f"[local] {m}", flush=True),
            )
            env_cmd = "python -m jobs.local env" + ("" if args.state_dir == str(DEFAULT_STATE_DIR) else f" --state-dir {args.state_dir}")
            print(
                f"[local] up in {time.monotonic() - started:.0f}s: {target.describe()}\n"
                f"  dashboard / jobs API: {cluster.dashboard_url} (token authentication on; token in {cluster.state_dir}/auth_token)\n"
                # The nodes already run JAX on CPU, one device per chip: no runtime env needed.
                f'  submit: eval "$({env_cmd})" && ray job submit --working-dir . -- '
                f"python -m jobs.healthcheck --generation {cluster.generation} --topology {cluster.topology} "
                f"--slices {cluster.slices}\n"
                f"  state and logs: {cluster.state_dir}"
            )
            return 0
        if args.command == "rayjob":
            return _rayjob(parser, args)
        if args.command == "preempt":
            try:
                print(f"[local] {preempt(args.state_dir, args.timeout)}", flush=True)
            except PreemptError as err:
                print(f"[local] error: {err}", file=sys.stderr)
                return 1
            return 0
        if args.command == "kill-host":
            try:
                print(f"[local] {kill_host(args.state_dir, args.slice, args.host, args.notice, args.back_after)}", flush=True)
            except FaultFlagError as err:
                parser.error(str(err))
            except FaultError as err:
                print(f"[local] error: {err}", file=sys.stderr)
                return 1
            return 0
        if args.command == "env":
            found = LocalCluster.load(args.state_dir)
            if found is None:
                print(f"[local] no local cluster in {args.state_dir}; start one with `python -m jobs.local up`", file=sys.stderr)
                return 1
            print(client_exports(found.state_dir, found.dashboard_url))
            return 0
        if args.command == "status":
            st = status(args.state_dir)
            if st is None:
                print(f"[local] no local cluster in {args.state_dir}")
                return 1
            c = st.cluster
            print(f"[local] {c.slices} x {c.shape} at {c.dashboard_url} (GCS {c.gcs_address})")
            for node in st.dead_nodes:
                print(f"  DOWN: {node.describe()} (pid {node.pid}); log {node.log}")
            for s in st.inventory:
                print(f"  {s.describe()}")
            print(f"  idle whole slices: {'unknown' if st.idle_slices is None else st.idle_slices}")
            return 0 if st.healthy else 1
        stopped = down(args.state_dir)
        print(f"[local] stopped {len(stopped.nodes)} node(s)" if stopped else f"[local] nothing running in {args.state_dir}")
        return 0
    except LocalClusterError as err:
        print(f"[local] error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
