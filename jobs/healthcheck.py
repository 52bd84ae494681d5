"""Is the slice whole and do its chips talk? One all-reduce over every chip, checked.

    python -m jobs.healthcheck --generation v6e --topology 4x4 [--slices N] [--reserve-timeout S]

Reserves the slices, runs one JAX process per host (coordinator: worker 0 of slice 0), and has every
device contribute `device index + 1` to a `psum` over all devices, so the right answer is
n(n+1)/2 everywhere and a device that is missing or counted twice changes it. Then times a small
all-reduce (latency) and a `--payload-mb` one per chip (bus bandwidth, as nccl-tests defines it).

Prints a summary and one `HEALTHCHECK {json}` line. Exits 0 when the slice is whole and the result
right, 1 when it is not (or the slice cannot be reserved in time), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from infra import catalog
from jobs import cli
from jobs.runtime import progress
from jobs.runtime.inventory import missing_worker_ids
from jobs.runtime.launch import JaxProcess, initialize_jax
from jobs.runtime.outcomes import Succeeded
from jobs.runtime.reruns import DEFAULT_RETRY_BUDGET, RetryBudget, RunReport, run_on_slices

AXIS = "chips"
# A healthcheck step (joining, one all-reduce) takes seconds; minutes of silence is a hang.
DEFAULT_STEP_TIMEOUT_S = 300.0


# --- pure checks -------------------------------------------------------------------------------


def expected_sum(devices: int) -> float:
    """Each device contributes its index + 1: 1 + 2 + ... + n."""
    return devices * (devices + 1) / 2


def allreduce_is_correct(values: Sequence[float], devices: int) -> bool:
    """Every value a device holds after the all-reduce must be the full sum (exact in float32 for
    the device counts of any slice: n(n+1)/2 < 2**24)."""
    return len(values) > 0 and all(v == expected_sum(devices) for v in values)


def bus_bandwidth(bytes_per_device: int, seconds: float, devices: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw * 2(n-1)/n, comparable across sizes."""
    if seconds <= 0 or devices < 2:
        return 0.0
    return bytes_per_device / seconds * 2 * (devices - 1) / devices


@dataclass(frozen=True)
class HostReport:
    """What one JAX process saw."""

    process_id: int
    slice_name: str
    worker_id: int
    node_id: str
    hostname: str
    platform: str
    device_kind: str
    process_count: int
    local_devices: int
    global_devices: int
    values: tuple[float, ...]  # distinct values this host's shards hold after the check all-reduce
    correct: bool  # every element of every local shard, small and large payload
    latency_s: float  # median of the small all-reduce
    allreduce_s: float  # median of the payload all-reduce
    payload_bytes: int  # per device


def check(reports: Sequence[HostReport], shape: catalog.SliceShape, slices: int) -> tuple[str, ...]:
    """Everything that says the slice is not whole or not right; empty when it is."""
    problems = []
    hosts = shape.hosts * slices
    devices = shape.jax_devices * slices
    if len(reports) != hosts:
        problems.append(f"{len(reports)} JAX processes reported, expected {hosts} (one per host)")
    for r in reports:
        where = f"process {r.process_id} ({r.slice_name} worker {r.worker_id})"
        if r.process_count != hosts:
            problems.append(f"{where} sees {r.process_count} processes, expected {hosts}")
        if r.global_devices != devices:
            problems.append(f"{where} sees {r.global_devices} devices, expected {devices}")
        if r.local_devices != shape.jax_devices_per_host:
            problems.append(f"{where} has {r.local_devices} local devices, expected {shape.jax_devices_per_host}")
        if not r.correct:
            problems.append(f"{where} holds {list(r.values)} after the all-reduce, expected {expected_sum(r.global_devices):g}")
    nodes = [r.node_id for r in reports]
    if len(set(nodes)) != len(nodes):
        problems.append("two processes ran on the same node")
    for name in sorted({r.slice_name for r in reports}):
        missing = missing_worker_ids((r.worker_id for r in reports if r.slice_name == name), shape.hosts)
        if missing:
            problems.append(f"slice {name} is missing worker id {','.join(map(str, missing))}")
    return tuple(problems)


@dataclass(frozen=True)
class HealthcheckResult:
    target: str
    hosts: int
    devices: int
    expected_devices: int
    expected_sum: float
    correct: bool
    platform: str
    device_kind: str
    latency_s: float  # slowest host's median
    payload_bytes: int
    allreduce_s: float
    bus_bandwidth_bytes_per_s: float
    reserve_s: float
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    def summary(self) -> str:
        lines = [
            f"healthcheck {'PASSED' if self.ok else 'FAILED'}: {self.target}",
            f"  hosts {self.hosts}, devices {self.devices} of {self.expected_devices} ({self.platform}, {self.device_kind})",
            f"  all-reduce sum {'correct' if self.correct else 'WRONG'} (expected {self.expected_sum:g} on every device)",
            f"  latency {self.latency_s * 1e3:.2f} ms; {self.payload_bytes / 2**20:.1f} MiB per device in "
            f"{self.allreduce_s * 1e3:.2f} ms = bus bandwidth {self.bus_bandwidth_bytes_per_s / 1e9:.3f} GB/s",
            f"  slice reserved in {self.reserve_s:.2f} s",
        ]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def summarize(reports: Sequence[HostReport], shape: catalog.SliceShape, slices: int, target: str, reserve_s: float) -> HealthcheckResult:
    devices = max((r.global_devices for r in reports), default=0)
    payload = max((r.payload_bytes for r in reports), default=0)
    slowest = max((r.allreduce_s for r in reports), default=0.0)
    first = reports[0] if reports else None
    return HealthcheckResult(
        target=target,
        hosts=len({r.node_id for r in reports}),
        devices=devices,
        expected_devices=shape.jax_devices * slices,
        expected_sum=expected_sum(shape.jax_devices * slices),
        correct=bool(reports) and all(r.correct for r in reports),
        platform=first.platform if first else "?",
        device_kind=first.device_kind if first else "?",
        latency_s=max((r.latency_s for r in reports), default=0.0),
        payload_bytes=payload,
        allreduce_s=slowest,
        bus_bandwidth_bytes_per_s=bus_bandwidth(payload, slowest, devices),
        reserve_s=reserve_s,
        problems=check(reports, shape, slices),
    )


# --- on each host ------------------------------------------------------------------------------


def allreduce_on_host(process: JaxProcess, payload_bytes: int, iters: int, init_timeout_s: int) -> HostReport:
    """One JAX process of the healthcheck: join, all-reduce, check this host's shards, time it."""
    import ray

    initialize_jax(process, init_timeout_s)
    progress.beat("joined")
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    try:
        devices = jax.devices()  # every device of every process, in process order
        n = len(devices)
        mesh = Mesh(np.array(devices), (AXIS,))
        sharding = NamedSharding(mesh, P(AXIS))
        allreduce = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, AXIS), mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))

        def contributions(per_device: int) -> jax.Array:
            def shard(idx: tuple[slice, ...] | None) -> np.ndarray:
                # Device i's shard is all (i + 1): its position along the mesh axis.
                if idx is None:  # JAX passes every addressable shard's index; None never comes for a sharding
                    raise TypeError("make_array_from_callback gave no shard index")
                return np.full(per_device, idx[0].start // per_device + 1, np.float32)

            return jax.make_array_from_callback((n * per_device,), sharding, shard)

        def run(per_device: int) -> tuple[float, bool, set[float]]:
            x = contributions(per_device)
            y = allreduce(x).block_until_ready()  # compile, and the checked result
            values: set[float] = set()
            ok = True
            for shard in y.addressable_shards:
                data = np.asarray(shard.data)
                values.update(float(v) for v in np.unique(data))
                ok = ok and allreduce_is_correct(np.unique(data).tolist(), n)
            times = []
            progress.beat(f"all-reduce of {per_device} per device compiled")
            for i in range(iters):
                start = time.perf_counter()
                allreduce(x).block_until_ready()
                times.append(time.perf_counter() - start)
                progress.beat(f"all-reduce of {per_device} per device, iteration {i + 1}")
            return statistics.median(times), ok, values

        latency, small_ok, values = run(1)
        elems = max(1, payload_bytes // 4)
        big_s, big_ok, _ = run(elems)
        return HostReport(
            process_id=process.process_id,
            slice_name=process.slice_name,
            worker_id=process.worker_id,
            node_id=ray.get_runtime_context().get_node_id(),
            hostname=socket.gethostname(),
            platform=devices[0].platform,
            device_kind=devices[0].device_kind,
            process_count=jax.process_count(),
            local_devices=jax.local_device_count(),
            global_devices=n,
            values=tuple(sorted(values)),
            correct=small_ok and big_ok,
            latency_s=latency,
            allreduce_s=big_s,
            payload_bytes=elems * 4,
        )
    finally:
        jax.distributed.shutdown()


# --- driver ------------------------------------------------------------------------------------


def run_healthcheck(
    target: cli.SliceTarget,
    payload_mb: float = 4.0,
    iters: int = 5,
    timeout_s: float = 600.0,
    budget: RetryBudget = DEFAULT_RETRY_BUDGET,
    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S,
) -> RunReport:
    """Reserve, run one process per host, summarise; rerun on a whole slice after a lost host.
    Needs `ray.init()` done. The report's value is a `HealthcheckResult` when an attempt succeeded."""
    reserve_timeout = target.reserve_timeout_s or cli.DEFAULT_RESERVE_TIMEOUT_S
    report = run_on_slices(
        target.shape,
        target.slices,
        allreduce_on_host,
        int(payload_mb * 2**20),
        iters,
        int(min(timeout_s, 300)),
        budget=budget,
        reserve_timeout_s=reserve_timeout,
        timeout_s=timeout_s,
        step_timeout_s=step_timeout_s,
        name="healthcheck",
        log=lambda line: print(line, flush=True),
    )
    if report.ok:
        last = report.attempts[-1]
        result = summarize(report.value, target.shape, target.slices, target.describe(), last.reserve_s)
        return RunReport(Succeeded(result), report.attempts)
    return report


def _parser() -> cli.JobArgumentParser:
    parser = cli.JobArgumentParser(prog="python -m jobs.healthcheck", description=__doc__.split("\n\n")[0])
    cli.add_slice_flags(parser)
    parser.add_argument("--payload-mb", type=cli.positive_number, default=4.0, metavar="MIB", help="all-reduce size per chip (default 4)")
    parser.add_argument("--iters", type=cli.positive_int, default=5, help="timed repetitions (default 5)")
    parser.add_argument(
        "--timeout",
        type=cli.positive_seconds,
        default=600.0,
        metavar="SECONDS",
        help="bound on the per-host work of one attempt (default 600)",
    )
    cli.add_fault_flags(parser, step_timeout_s=DEFAULT_STEP_TIMEOUT_S)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, cli.SliceTarget]:
    return cli.parse(_parser(), argv)


def main(argv: Sequence[str] | None = None) -> int:
    args, target = parse_args(argv)
    print(f"healthcheck: reserving {target.describe()} (timeout {target.reserve_timeout_s:.0f}s)", flush=True)
    cli.connect_ray()
    report = run_healthcheck(target, args.payload_mb, args.iters, args.timeout, RetryBudget.from_args(args), args.step_timeout)
    failed = cli.finish(report, "healthcheck", "HEALTHCHECK", HealthcheckResult.summary, HealthcheckResult.to_json)
    return failed if failed is not None else (0 if report.value.ok else 1)


if __name__ == "__main__":
    sys.exit(main())
