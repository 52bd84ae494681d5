"""What became of one run on a slice, as a small typed value, and the pure rules that decide it.

    Succeeded(value)          every host returned
    HostLost(reason)          a host went away (preempted, died, or made no progress): rerun on a whole slice
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

from dataclasses import dataclass
from typing import Any, Sequence, Union

from jobs.slices import ReservationError, SliceUnavailableError


@dataclass(frozen=True)
class Succeeded:
    value: Any

    kind = "succeeded"


@dataclass(frozen=True)
class HostLost:
    reason: str

    kind = "host-lost"


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


Outcome = Union[Succeeded, HostLost, Failed, Cancelled]


class NoProgressError(TimeoutError):
    """No host reported progress for longer than the step timeout: a hang, handled as a lost host."""


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
        "PreemptionError",
        "NoProgressError",
    }
)
# The process died without the node going away (OOM-killed, segfault, os._exit): not the job's
# Python code, and possibly transient, so charged to the failure budget.
CRASH_TYPES = frozenset({"WorkerCrashedError", "OutOfMemoryError", "ObjectStoreFullError", "OutOfDiskError"})
CANCEL_TYPES = frozenset({"TaskCancelledError", "KeyboardInterrupt", "CancelledError"})
# What `jax.distributed` (gRPC coordination service) and the collectives (Gloo on CPU, ICI/DCN on
# TPU) say when a peer process disappears. Matched case-insensitively in the message.
PEER_LOST_MARKERS = (
    "deadline_exceeded",
    "deadline exceeded",
    "unavailable:",
    "heartbeat",
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
    """`error`, the task error's cause, and their __cause__/__context__, without cycles."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return seen


def _type_names(error: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(error).__mro__}


def _first_line(error: BaseException) -> str:
    """`Type: first line of the message`; for a task error, that of the exception the task raised."""
    cause = getattr(error, "cause", None)
    if "RayTaskError" in _type_names(error) and isinstance(cause, BaseException):
        error = cause
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def classify(error: BaseException, dead_hosts: Sequence[str] = ()) -> HostLost | Failed | Cancelled:
    """The outcome an exception from a run means (pure). `dead_hosts` describes reserved hosts that
    were no longer alive when the run failed: whatever the exception says, that is a lost host."""
    chain = _chain(error)
    if any(_type_names(e) & CANCEL_TYPES for e in chain):
        return Cancelled(_first_line(error))
    if isinstance(error, SliceUnavailableError):  # its inventory text may mention lost hosts
        return Failed(str(error), user_error=False, no_slice=True)
    if dead_hosts:
        return HostLost(f"lost {', '.join(dead_hosts)} ({_first_line(error)})")
    for e in chain:
        if _type_names(e) & HOST_LOST_TYPES or getattr(e, "preempted", False) is True:
            return HostLost(_first_line(e))
    for e in chain:
        if any(marker in str(e).lower() for marker in PEER_LOST_MARKERS):
            return HostLost(_first_line(e))
    for e in chain:
        if isinstance(e, ReservationError):
            return Failed(str(e), user_error=False)
        if _type_names(e) & CRASH_TYPES or "RayActorError" in _type_names(e):
            return Failed(_first_line(e), user_error=False)
    if "RayTaskError" in _type_names(error):  # the job's own code raised
        return Failed(_first_line(error), user_error=True)
    # Our bounded waits (TimeoutError) and Ray's own errors are infrastructure; anything else was
    # raised by code, and will be raised again by a rerun.
    infrastructure = isinstance(error, TimeoutError) or "RayError" in _type_names(error)
    return Failed(_first_line(error), user_error=not infrastructure)
