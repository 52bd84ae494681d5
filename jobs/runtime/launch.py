"""One JAX process per reserved host: the coordinator, process ids and multislice variables, and
the bounded run of a function on every host (first failure, silence or the overall bound ends it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobs.runtime import progress
from jobs.runtime.deadlines import Deadline
from jobs.runtime.net import free_port
from jobs.runtime.reservation import Host, Reservation, ReservationError


@dataclass(frozen=True)
class JaxProcess:
    """What one host needs for `jax.distributed.initialize`, plus the multislice variables."""

    process_id: int
    num_processes: int
    coordinator_address: str  # "ip:port" of worker 0 of slice 0
    slice_index: int
    slice_name: str
    worker_id: int
    env: tuple[tuple[str, str], ...] = ()  # MEGASCALE_* for several slices

    @property
    def env_vars(self) -> dict[str, str]:
        return dict(self.env)


def jax_processes(hosts: Sequence[Host], slices: int, coordinator_port: int) -> tuple[JaxProcess, ...]:
    """One `JaxProcess` per host: ids in host order, worker 0 of slice 0 coordinates (pure)."""
    from ray.util.tpu import get_tpu_coordinator_env_vars  # pure: builds a dict

    coordinator = hosts[0]
    if coordinator.slice_index != 0 or coordinator.worker_id != 0:
        raise ReservationError(f"the first host must be worker 0 of slice 0, got {coordinator}")
    out = []
    for host in hosts:
        env = get_tpu_coordinator_env_vars(coordinator.address, slices, host.slice_index) if slices > 1 else {}
        out.append(
            JaxProcess(
                process_id=host.process_id,
                num_processes=len(hosts),
                coordinator_address=f"{coordinator.address}:{coordinator_port}",
                slice_index=host.slice_index,
                slice_name=host.slice_name,
                worker_id=host.worker_id,
                env=tuple(sorted(env.items())),
            )
        )
    return tuple(out)


def initialize_jax(process: JaxProcess, timeout_s: int = 300) -> None:
    """Run inside the per-host task: join the JAX job described by `process` (bounded)."""
    os.environ.update(process.env_vars)
    import jax

    jax.distributed.initialize(
        coordinator_address=process.coordinator_address,
        num_processes=process.num_processes,
        process_id=process.process_id,
        initialization_timeout=int(timeout_s),
    )


def run_per_host(
    reservation: Reservation,
    fn: Callable[..., Any],
    *args: Any,
    timeout_s: float,
    step_timeout_s: float | None = None,
    runtime_env: Mapping[str, Any] | None = None,
    on_start: Callable[[Reservation, Sequence[JaxProcess]], None] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(process: JaxProcess, *args, **kwargs)` once on every reserved host, with all of its
    chips, and return the results in process order.

    Bounded three ways: the whole run by `timeout_s` (`TimeoutError`); silence by `step_timeout_s`,
    if given (`NoProgressError` when no host called `progress.beat()` for that long); and the
    first host to fail ends the run at once with that host's error, instead of waiting for the
    others, which are usually blocked in a collective with it. `on_start(reservation, processes)`
    is called once the JAX processes are known.

    Each host runs `fn` in an actor of its own (`_Host`), killed when the run ends, however it
    ends: a fresh process per run, because `jax.distributed` can only be initialized once per
    process and must not leak into the next job. Actors and `ray.kill`, not tasks and
    `ray.cancel(force=True)`: in Ray 2.60 a task cancelled while its reply is arriving crashes the
    driver (a failed check, `Tried to complete task that was not pending`, exit status 1, no
    traceback). That was seen here when every host raised the same error at once, the usual way a
    bug in the job fails; it is the race of ray-project/ray#54846, whose fix (#54798) covered
    retries only. Ray's actor-task path drops a reply that arrives after the actor was killed
    ("The task has already been marked as failed. Ignore the reply.", in the installed _raylet.so).
    """
    import ray

    deadline = Deadline(timeout_s)
    extra = {"runtime_env": dict(runtime_env)} if runtime_env else {}
    port_task = ray.remote(free_port).options(**reservation.host_options(reservation.coordinator, resources={}))
    port = ray.get(port_task.remote(), timeout=deadline.remaining())
    processes = jax_processes(reservation.hosts, reservation.slices, port)
    if on_start:
        on_start(reservation, processes)
    board = progress.start_board(len(processes)) if step_timeout_s else None
    # No restarts or task retries: Ray would otherwise rerun a dead host's share by itself on a
    # recreated node, with the old coordinator, while the driver reruns the whole slice; the
    # driver owns retries.
    host_actor = ray.remote(max_restarts=0, max_task_retries=0)(_Host)
    actors: list[Any] = [host_actor.options(**reservation.host_options(host, **extra)).remote() for host in reservation.hosts]
    name = getattr(fn, "__name__", "host_task")
    refs = [
        actor.run.options(name=name).remote(board, fn, process, *args, **kwargs) for actor, process in zip(actors, processes, strict=True)
    ]
    running = dict(zip(refs, range(len(refs)), strict=True))  # ref -> process id
    try:
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=min(1.0, deadline.remaining()))
            for ref in ready:
                ray.get(ref)  # raises now if this host failed
                del running[ref]
            if ready:
                continue
            if deadline.expired():
                raise TimeoutError(f"the per-host tasks did not finish within {timeout_s:.0f}s")
            if board is not None and step_timeout_s is not None:  # the board runs only with a step timeout
                silent = progress.stalled(ray.get(board.silence.remote(), timeout=30), running.values(), step_timeout_s)
                if silent:
                    where = [f"worker {h.worker_id} of slice {h.slice_name}" for h in reservation.hosts]
                    raise progress.NoProgressError(progress.describe_silence(silent, step_timeout_s, where))
        return ray.get(refs, timeout=30)
    finally:
        for actor in actors:  # done, one host failed, a bound ran out, or Ctrl-C: end every process
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if board is not None:
            progress.stop_board(board)


class _Host:
    """One host's share of a run, in a process of its own (`run_per_host`)."""

    def run(self, board: Any, fn: Callable[..., Any], process: JaxProcess, *args: Any, **kwargs: Any) -> Any:
        """Connect `progress.beat()` to the run's board, then run the job."""
        progress.attach(board, process.process_id)
        return fn(process, *args, **kwargs)
