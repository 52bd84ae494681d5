"""Reruns: reserve whole slices, run on every host, and rerun on a whole slice when a host is lost,
within separate budgets for lost hosts and for failures.

    report = run_on_slices(shape, slices, fn, *args, budget=RetryBudget(...), reserve_timeout_s=...,
                           timeout_s=..., step_timeout_s=...)

Each attempt is one `reserve_slices` + `run_per_host`, so it gets a fresh reservation and fresh JAX
processes: the coordinator address, process ids and `MEGASCALE_*` variables are recomputed from the
hosts of that attempt, never carried over from a slice that is gone. Between attempts the whole
reservation is released (the `with` block ends before the next one starts), so no half-held slice
blocks anyone, and the next reservation waits, bounded by `reserve_timeout_s`, for slices that are
whole and idle: a slice still missing its lost host is skipped, not waited on.

What an attempt's exception means is `outcomes.classify`'s job (pure); what to do about it is
`decide` (pure): a lost host (preempted, died, or silent past the step timeout) is rerun while the
lost-host budget lasts, an infrastructure failure while the failure budget lasts, and a user error
or a cancellation never. `retry` is that loop alone; `jobs.train.fit` runs Ray Train's `fit()` under it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra import catalog
from jobs.runtime.deadlines import Deadline
from jobs.runtime.inventory import SliceUnavailableError
from jobs.runtime.labels import alive_of_pod_type
from jobs.runtime.launch import JaxProcess, run_per_host
from jobs.runtime.outcomes import OUTCOME_TYPES, Cancelled, Failed, HostLost, Outcome, Preempted, Resized, Succeeded, classify
from jobs.runtime.reservation import Host, Reservation, reserve_slices

_log = logging.getLogger("jobs.runtime").info

# After a host task fails, how long to wait for the GCS to notice a dead node (its health check
# needs a few seconds), so that a host killed mid-run is reported as lost rather than as a crash.
NODE_DEATH_GRACE_S = 20.0


@dataclass(frozen=True)
class RetryBudget:
    """How many reruns each kind of fault gets (`--max-preemptions`, `--max-failures`). A user error
    and a cancellation get none."""

    max_preemptions: int = 3  # a host preempted (with a notice or without), died, or silent past the step timeout
    max_failures: int = 0  # infrastructure failures: a crashed worker, a bounded wait that ran out

    @classmethod
    def from_args(cls, args: Any) -> RetryBudget:
        return cls(max_preemptions=args.max_preemptions, max_failures=args.max_failures)


DEFAULT_RETRY_BUDGET = RetryBudget()  # the default argument of the run_* entry points (frozen: shared safely)


@dataclass(frozen=True)
class Attempt:
    number: int  # from 1
    outcome: Outcome
    slice_names: tuple[str, ...]
    coordinator: str | None  # "ip:port" of this attempt's JAX coordinator
    seconds: float
    reserve_s: float = 0.0  # how long the reservation took

    def describe(self) -> str:
        where = f" on {', '.join(self.slice_names)}" if self.slice_names else ""
        coordinator = f" (coordinator {self.coordinator})" if self.coordinator else ""
        reason = "" if isinstance(self.outcome, Succeeded) else f": {self.outcome.reason}"
        return f"attempt {self.number}{where}{coordinator}: {self.outcome.kind} after {self.seconds:.1f}s{reason}"


@dataclass(frozen=True)
class RunReport:
    outcome: Outcome  # of the last attempt
    attempts: tuple[Attempt, ...]

    @property
    def ok(self) -> bool:
        return isinstance(self.outcome, Succeeded)

    @property
    def value(self) -> Any:
        return self.outcome.value if isinstance(self.outcome, Succeeded) else None

    def describe(self) -> str:
        return "\n".join(a.describe() for a in self.attempts)


def decide(outcome: Outcome, attempts: Sequence[Outcome], budget: RetryBudget) -> str | None:
    """Rerun after `outcome`? None to rerun, else why not (pure). `attempts` are the outcomes so far,
    `outcome` included."""
    if isinstance(outcome, Succeeded):
        return "succeeded"
    if isinstance(outcome, Cancelled):
        return "cancelled: not rerun"
    if isinstance(outcome, Failed) and outcome.user_error:
        return "a user error: not rerun (it would fail the same way)"
    if isinstance(outcome, Failed) and outcome.no_slice:
        return "no whole slice within --reserve-timeout: not rerun"
    if isinstance(outcome, Resized):  # an elastic run's planned stop at a step boundary: no fault
        return None
    if isinstance(outcome, HostLost | Preempted):
        used = sum(isinstance(o, HostLost | Preempted) for o in attempts)
        limit, flag = budget.max_preemptions, "--max-preemptions"
    else:
        used = sum(isinstance(o, Failed) and not o.user_error for o in attempts)
        limit, flag = budget.max_failures, "--max-failures"
    return None if used <= limit else f"{used} {outcome.kind} fault(s), more than {flag} {limit}"


@dataclass(frozen=True)
class WatchedHost:
    """A TPU host an attempt runs on, to tell afterwards whether it died (a reservation's `Host`
    serves too)."""

    node_id: str
    slice_name: str
    worker_id: int


def watched_hosts(nodes: Sequence[Mapping[str, Any]], shape: catalog.SliceShape) -> tuple[WatchedHost, ...]:
    """The alive hosts of `shape`'s pod type in `ray.nodes()` (pure), for work that reserves through
    someone else (Ray Train) and so has no `Host` list of its own."""
    return tuple(
        WatchedHost(n.node_id, n.slice_name or "?", -1 if n.worker_id is None else n.worker_id)
        for n in alive_of_pod_type(list(nodes), shape.pod_type)
    )


def lost_hosts(hosts: Sequence[Host | WatchedHost], nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """The given hosts whose nodes are no longer alive, described (pure: takes `ray.nodes()`)."""
    alive = {n.get("NodeID") for n in nodes if n.get("Alive")}
    return [f"worker {h.worker_id} of slice {h.slice_name}" for h in hosts if h.node_id not in alive]


def _wait_for_lost_hosts(hosts: Sequence[Host | WatchedHost], error: BaseException) -> list[str]:
    """Dead hosts among `hosts`, waiting (bounded) for the GCS to notice when the error looks like one."""
    import ray

    if not hosts:  # nothing was reserved yet: no host of ours to have lost
        return []
    deadline = Deadline(NODE_DEATH_GRACE_S if may_be_node_death(error) else 0.0)
    while True:
        try:
            dead = lost_hosts(hosts, ray.nodes())
        except Exception:  # the GCS itself is unreachable: nothing to add
            return []
        if dead or deadline.expired():
            return dead
        deadline.sleep(0.5)


def classify_failure(error: BaseException, hosts: Sequence[Host | WatchedHost]) -> Outcome:
    """`classify`, told which of the attempt's hosts have died (call it before releasing them)."""
    return classify(error, _wait_for_lost_hosts(hosts, error))


def may_be_node_death(error: BaseException) -> bool:
    """Could `error` come from a node that is dying but not yet marked dead? A crashed worker or a
    broken collective can; a user error, a cancellation or one of our own timeouts cannot (pure)."""
    if isinstance(error, TimeoutError):
        return False
    outcome = classify(error)
    return isinstance(outcome, HostLost | Preempted) or (isinstance(outcome, Failed) and not outcome.user_error)


INTERRUPTED = "interrupted (Ctrl-C or `ray job stop`)"


def attempt_outcome(
    run: Callable[[], Any], hosts: Sequence[Host | WatchedHost] = (), passthrough: tuple[type[BaseException], ...] = ()
) -> Outcome:
    """The one error ladder of an attempt: `run()`'s value as `Succeeded` (an `Outcome` it returns is
    kept as is); no whole slice in time, Ctrl-C, or any other error as the outcome it means, told
    which of `hosts` died. `passthrough` errors propagate (a job's own early exits)."""
    try:
        value = run()
    except passthrough:
        raise
    except SliceUnavailableError as err:
        return classify(err)
    except KeyboardInterrupt:
        return Cancelled(INTERRUPTED)
    except Exception as err:
        return classify_failure(err, hosts)
    return value if isinstance(value, OUTCOME_TYPES) else Succeeded(value)


def retry(attempt_once: Callable[[int], Attempt], budget: RetryBudget, name: str, log: Callable[[str], None]) -> RunReport:
    """Call `attempt_once(number)` (from 1) until an attempt succeeds, fails for good, or its budget
    runs out (`decide`). Each attempt must hold nothing when it returns."""
    attempts: list[Attempt] = []
    while True:
        attempts.append(attempt_once(len(attempts) + 1))
        outcome = attempts[-1].outcome
        why_not = decide(outcome, [a.outcome for a in attempts], budget)
        if why_not is not None:
            if not isinstance(outcome, Succeeded):
                log(f"{name}: {attempts[-1].describe()}; {why_not}")
            return RunReport(outcome, tuple(attempts))
        then = (
            f"continuing on {outcome.slices} slice(s)" if isinstance(outcome, Resized) else "released the slice, rerunning on a whole one"
        )
        log(f"{name}: {attempts[-1].describe()}; {then}")


@dataclass
class _Started:
    """What an attempt learnt once its JAX processes were known (for its `Attempt`)."""

    slices: tuple[str, ...] = ()
    coordinator: str | None = None
    reserve_s: float = 0.0


def run_on_slices(
    shape: catalog.SliceShape,
    slices: int,
    fn: Callable[..., Any],
    *args: Any,
    budget: RetryBudget,
    reserve_timeout_s: float,
    timeout_s: float,
    step_timeout_s: float | None = None,
    name: str = "jobs",
    log: Callable[[str], None] = _log,
    runtime_env: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> RunReport:
    """Run `fn(process, *args, **kwargs)` on every host of `slices` whole slices until it succeeds,
    fails for good, or a budget runs out. Needs `ray.init()` done. Never raises for a run's fault:
    the report's outcome says what happened; Ctrl-C ends in `Cancelled`."""

    def attempt_once(number: int) -> Attempt:
        started = time.monotonic()
        seen = _Started()

        def started_on(reservation: Reservation, processes: Sequence[JaxProcess]) -> None:
            seen.slices = reservation.slice_names
            seen.coordinator = processes[0].coordinator_address
            seen.reserve_s = reservation.ready_s
            log(f"{name}: attempt {number} on {', '.join(seen.slices)}, coordinator {seen.coordinator}")

        def reserved() -> Outcome:
            with reserve_slices(shape, slices, reserve_timeout_s, name=name) as reservation:
                # Classified inside the reservation: dead hosts are looked for before anything is released.
                return attempt_outcome(
                    lambda: run_per_host(
                        reservation,
                        fn,
                        *args,
                        timeout_s=timeout_s,
                        step_timeout_s=step_timeout_s,
                        runtime_env=runtime_env,
                        on_start=started_on,
                        **kwargs,
                    ),
                    reservation.hosts,
                )

        outcome = attempt_outcome(reserved)
        return Attempt(number, outcome, seen.slices, seen.coordinator, time.monotonic() - started, seen.reserve_s)

    return retry(attempt_once, budget, name, log)
