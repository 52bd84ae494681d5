"""What became of one run on a slice, as a small typed value, and the pure rules that decide it.

    Succeeded(value)          every host returned
    Preempted(reason, saved_step) a host was preempted with a notice: the run saved `saved_step` inside
                              it (None: no save fitted, the last checkpoint stands); rerun
    HostLost(reason)          a host went away with no notice (died, or made no progress): rerun on a whole slice
    Resized(reason, slices)   an elastic run saved at a step boundary to continue on `slices` slices: rerun
    Failed(reason, user_error) the program failed; a user error (an exception in the job's own code) is not
                              worth rerunning, an infrastructure failure (a crashed worker, a timeout) may be
    Cancelled(reason)         Ctrl-C, `ray job stop`, or a cancelled task: never rerun

`classify(error)` maps an exception to one of the last three. It only looks at types and messages,
so it is tested with exceptions built by hand. A lost host rarely shows up as one clean exception:
the host's own task dies with a node or worker error, and the hosts that were waiting for it in a
collective fail a moment later with gRPC/Gloo errors from `jax.distributed`. Those collateral errors
are classified as a lost host too, not as a bug in the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobs.runtime.inventory import SliceUnavailableError
from jobs.runtime.progress import NoProgressError
from jobs.runtime.reservation import ReservationError


@dataclass(frozen=True)
class Succeeded:
    value: Any

    kind = "succeeded"


@dataclass(frozen=True)
class HostLost:
    reason: str

    kind = "host-lost"


@dataclass(frozen=True)
class Preempted:
    reason: str
    saved_step: int | None = None  # the checkpoint saved on the notice, if one fitted in it

    kind = "preempted"


@dataclass(frozen=True)
class Resized:
    reason: str
    slices: int  # how many whole slices the next attempt takes

    kind = "resized"


@dataclass(frozen=True)
class Failed:
    reason: str
    user_error: bool
    # No whole slice came free within --reserve-timeout: rerunning would only wait again.
    no_slice: bool = False

    @property
    def kind(self) -> str:
        return "user-error" if self.user_error else "failed"


@dataclass(frozen=True)
class Cancelled:
    reason: str

    kind = "cancelled"


Outcome = Succeeded | Preempted | HostLost | Resized | Failed | Cancelled
OUTCOME_TYPES = (Succeeded, Preempted, HostLost, Resized, Failed, Cancelled)


# Ray Train's error when a drained (preempted) node's workers ended, or its deadline passed, before
# the training function returned: a preemption with notice, whose save (if any) the ledger holds.
PREEMPTED_TYPES = frozenset({"PreemptionError"})
# Exception class names (anywhere in the cause chain) that mean a host or its raylet went away.
HOST_LOST_TYPES = frozenset(
    {
        "NodeDiedError",
        "LocalRayletDiedError",
        "OwnerDiedError",
        "ObjectLostError",
        "ObjectFetchTimedOutError",
        "ObjectReconstructionFailedError",
        "ActorUnavailableError",
        "TaskPlacementGroupRemoved",
        "ActorPlacementGroupRemoved",
        NoProgressError.__name__,
    }
)
# The process died without the node going away (OOM-killed, segfault, os._exit): not the job's
# Python code, and possibly transient, so charged to the failure budget.
CRASH_TYPES = frozenset({"WorkerCrashedError", "OutOfMemoryError", "ObjectStoreFullError", "OutOfDiskError"})
CANCEL_TYPES = frozenset({"TaskCancelledError", "KeyboardInterrupt", "CancelledError"})
# The job's own code raised: in a Ray task, or in a Ray Train worker's training function.
USER_CODE_TYPES = frozenset({"RayTaskError", "UserExceptionWithTraceback"})
# Ray Train could not start a whole worker group in time: no whole slice, as for our own wait.
NO_SLICE_TYPES = frozenset({"WorkerGroupStartupTimeoutError"})
# Attributes under which Ray Train's errors keep the error they wrap (`_base_exc`: the user's own).
RAY_TRAIN_WRAPPED = ("health_check_failure", "controller_failure", "_base_exc")
# Errors whose text holds tracebacks: the markers below are matched against its exception lines only
# (`_peer_lost_line`), not file, function or source lines. Ray's serialization drops a task exception's
# `__cause__`, so a peer error the user's code re-raised lives on only in that text.
WRAPPER_TYPES = frozenset({"RayTaskError", "UserExceptionWithTraceback", "TrainingFailedError", "WorkerHealthCheckFailedError"})
_TRACEBACK_LINES = ("ray::", "Traceback (most recent call last)", "The above exception", "During handling of the above")
# What `jax.distributed` (gRPC coordination service) and the collectives (Gloo on CPU, ICI/DCN on
# TPU) say when a peer process disappears. Matched case-insensitively in the message.
PEER_LOST_MARKERS = (
    "deadline_exceeded",
    "deadline exceeded",
    "unavailable:",
    "heartbeat timeout",
    "coordination service",
    "connection reset by peer",
    "connection closed by peer",
    "socket closed",
    "broken pipe",
    "barrier timed out",
    "failed to connect to all addresses",
    "megascale",
    "slice health",
    "the node running this task died",
)


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and everything it wraps, without cycles: a task error's cause, `__cause__` and
    `__context__`, and what Ray Train wraps (each rank's failure, a failed worker health check, the
    controller's error, the user's exception)."""
    seen: list[BaseException] = []
    todo: list[Any] = [error]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
        todo += [getattr(e, attr, None) for attr in RAY_TRAIN_WRAPPED]
        failures = getattr(e, "worker_failures", None)
        todo += list(failures.values()) if isinstance(failures, dict) else []
    return seen


def _peer_lost_line(error: BaseException) -> str | None:
    """The reason to give when `error` says a peer went away, else None (pure). An error that carries
    tracebacks is read by its exception lines only (`Type: message`, unindented), not its file,
    function and source lines, and the reason is the line that said it."""
    if not _type_names(error) & WRAPPER_TYPES:
        return _first_line(error) if any(m in str(error).lower() for m in PEER_LOST_MARKERS) else None
    for line in str(error).splitlines():
        if line and not line[0].isspace() and not line.startswith(_TRACEBACK_LINES) and any(m in line.lower() for m in PEER_LOST_MARKERS):
            return line.strip()
    return None


def _user_failures(error: BaseException) -> list[BaseException]:
    """The ranks' failures in a Ray Train error that are the training function's own exceptions: Ray
    Train unwraps them before raising, so they are whatever the function raised, not Ray's errors."""
    failures = getattr(error, "worker_failures", None)
    values = failures.values() if isinstance(failures, dict) else ()
    return [f for f in values if isinstance(f, BaseException) and not {"RayError", "RayTrainError"} & _type_names(f)]


def _type_names(error: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(error).__mro__}


def _first_line(error: BaseException) -> str:
    """`Type: first line of the message`; for a task error, that of the exception the task raised."""
    cause = getattr(error, "cause", None)
    if "RayTaskError" in _type_names(error) and isinstance(cause, BaseException):
        error = cause
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def classify(error: BaseException, dead_hosts: Sequence[str] = ()) -> Preempted | HostLost | Failed | Cancelled:
    """The outcome an exception from a run means (pure). `dead_hosts` describes reserved hosts that
    were no longer alive when the run failed: whatever the exception says, that is a lost host."""
    chain = _chain(error)
    if any(_type_names(e) & CANCEL_TYPES for e in chain):
        return Cancelled(_first_line(error))
    if isinstance(error, SliceUnavailableError):  # its inventory text may mention lost hosts
        return Failed(str(error), user_error=False, no_slice=True)
    for e in chain:
        if _type_names(e) & NO_SLICE_TYPES:
            return Failed(_first_line(e), user_error=False, no_slice=True)
    for e in chain:  # Ray Train's preemption, or an actor on a node Ray drained (the notice came first)
        if _type_names(e) & PREEMPTED_TYPES or getattr(e, "preempted", False) is True:
            return Preempted(_first_line(e))
    if dead_hosts:
        return HostLost(f"lost {', '.join(dead_hosts)} ({_first_line(error)})")
    for e in chain:
        if _type_names(e) & HOST_LOST_TYPES:
            return HostLost(_first_line(e))
    for e in sorted(chain, key=lambda e: bool(_type_names(e) & WRAPPER_TYPES)):  # own messages first
        line = _peer_lost_line(e)
        if line:
            return HostLost(line)
    for e in chain:
        if isinstance(e, ReservationError):
            return Failed(str(e), user_error=False)
        if _type_names(e) & CRASH_TYPES or "RayActorError" in _type_names(e):
            return Failed(_first_line(e), user_error=False)
    for e in chain:
        if _type_names(e) & USER_CODE_TYPES:  # the job's own code raised: say what it raised
            user = getattr(e, "_base_exc", None)
            return Failed(_first_line(user if isinstance(user, BaseException) else e), user_error=True)
        if _user_failures(e):
            return Failed(_first_line(_user_failures(e)[0]), user_error=True)
    # Our bounded waits (TimeoutError) and Ray's and Ray Train's own errors are infrastructure;
    # anything else was raised by code, and will be raised again by a rerun.
    infrastructure = isinstance(error, TimeoutError) or bool({"RayError", "RayTrainError"} & _type_names(error))
    return Failed(_first_line(error), user_error=not infrastructure)
