"""`jobs.runtime.outcomes.classify` on exceptions built by hand (real `ray.exceptions` and `ray.train.v2`
classes included), and the typed results it returns: what counts as a lost host (including the
collateral gRPC/Gloo errors of the peers of a lost host), an infrastructure failure, a user error, no
slice, or a cancellation, and how `dead_hosts` overrides the exception; then what Ray Train's `fit()`
raises (worker group, controller and preemption errors), and errors as Ray really delivers them."""

from __future__ import annotations

import asyncio
import dataclasses
import traceback

import pytest
import ray.exceptions as rx
from ray import cloudpickle as ray_cloudpickle
from ray.core.generated.common_pb2 import ActorDiedErrorContext, NodeDeathInfo
from ray.train.v2._internal.exceptions import (
    CheckpointManagerInitializationError,
    UserExceptionWithTraceback,
    WorkerGroupStartupTimeoutError,
    WorkerHealthCheckFailedError,
)
from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus
from ray.train.v2.api.exceptions import ControllerError, NCCLHangError, PreemptionError, WorkerGroupError
from ray.train.v2.api.preemption import PreemptionInfo

from infra import catalog
from jobs.runtime.inventory import SliceInventory, SliceUnavailableError, describe_unavailable
from jobs.runtime.outcomes import Cancelled, Failed, HostLost, NoProgressError, Preempted, Succeeded, classify
from jobs.runtime.reservation import ReservationError


class XlaRuntimeError(RuntimeError):
    """Stands in for jaxlib's error (same name and base), so the tests need no jax import."""


def raised(error: BaseException) -> BaseException:
    """`error` after a real raise, so it has a traceback like one from running code."""
    try:
        raise error
    except BaseException as caught:
        return caught


def raised_from(fn, *args) -> BaseException:
    """What `fn(*args)` raises, with its traceback through `fn`."""
    try:
        fn(*args)
    except BaseException as caught:
        return caught
    raise AssertionError(f"{fn.__name__} did not raise")


def task_error(cause: BaseException) -> rx.RayTaskError:
    """What `ray.get` raises when a task raised `cause` (before Ray makes it an instance of the cause);
    its text is the task's traceback, as Ray's is."""
    text = "".join(traceback.format_exception(cause if cause.__traceback__ else raised(cause)))
    return rx.RayTaskError("host_task", text, cause, proctitle="ray::host_task", pid=4242, ip="10.0.0.2")


def dual_task_error(cause: BaseException) -> BaseException:
    """What `ray.get` really raises: a `RayTaskError(<cause type>)`, an instance of both."""
    return task_error(cause).as_instanceof_cause()


def actor_died(preempted: bool) -> rx.ActorDiedError:
    """An actor death as Ray reports it, from the GCS's context (preempted: the node was drained)."""
    death = NodeDeathInfo(reason=NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED, reason_message="spot VM reclaimed")
    context = ActorDiedErrorContext(
        error_message="The actor is dead because its node has died.",
        actor_id=b"\x01" * 16,
        class_name="HostActor",
        node_death_info=death if preempted else None,
    )
    return rx.ActorDiedError(context)


def slice_unavailable() -> SliceUnavailableError:
    """The real no-slice message: it talks about a slice that 'has lost a host'."""
    shape = catalog.shape("v6e", "4x4")
    inventory = (SliceInventory("tpu-a", (0, 1, 3), shape.hosts),)
    message = describe_unavailable(shape, 1, 600.0, "only 0 of the 1 slice(s) needed are whole and idle", inventory, {})
    assert "lost a host" in message  # the trap the classification must not fall into
    return SliceUnavailableError(message, inventory)


def with_context(error: BaseException, context: BaseException) -> BaseException:
    error.__context__ = context
    return error


def with_cause(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


# --- the typed results --------------------------------------------------------------------------


def test_each_result_type_has_its_own_kind():
    kinds = {
        "succeeded": Succeeded([1, 2]),
        "host-lost": HostLost("node died"),
        "failed": Failed("WorkerCrashedError: boom", user_error=False),
        "user-error": Failed("ValueError: bad", user_error=True),
        "cancelled": Cancelled("KeyboardInterrupt"),
    }
    for kind, outcome in kinds.items():
        assert outcome.kind == kind
    assert len({o.kind for o in kinds.values()}) == len(kinds)


def test_failed_is_not_a_no_slice_failure_unless_said_so():
    assert Failed("x", user_error=False).no_slice is False
    assert Failed("x", user_error=False, no_slice=True).no_slice is True
    assert Failed("x", user_error=False, no_slice=True).kind == "failed"


def test_results_are_immutable_values():
    with pytest.raises(dataclasses.FrozenInstanceError):
        HostLost("a").reason = "b"  # frozen: raises
    assert HostLost("a") == HostLost("a") and HostLost("a") != Cancelled("a")
    assert Succeeded([3]).value == [3]


# --- classify: one exception, one outcome -------------------------------------------------------

HOST_LOST_CASES = [
    pytest.param(rx.NodeDiedError("node 10.0.0.3 is dead"), "NodeDiedError: node 10.0.0.3 is dead", id="node-died"),
    pytest.param(rx.LocalRayletDiedError(), "LocalRayletDiedError: The task's local raylet died", id="raylet-died"),
    pytest.param(rx.OwnerDiedError("ab" * 14, None, ""), "OwnerDiedError: ", id="owner-died"),
    pytest.param(rx.ObjectLostError("cd" * 14, None, ""), "ObjectLostError: ", id="object-lost"),
    pytest.param(rx.ActorUnavailableError("restarting", None), "ActorUnavailableError: ", id="actor-unavailable"),
    pytest.param(rx.TaskPlacementGroupRemoved(), "TaskPlacementGroupRemoved: ", id="placement-group-removed"),
    pytest.param(NoProgressError("no progress within --step-timeout 30s"), "NoProgressError: no progress", id="no-progress"),
    # Collateral errors: the peers of a lost host fail in the collective or the coordination service.
    pytest.param(
        task_error(XlaRuntimeError("DEADLINE_EXCEEDED: Barrier timed out. Id: step_12")),
        "XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out",
        id="jax-deadline-exceeded-in-task",
    ),
    pytest.param(
        dual_task_error(XlaRuntimeError("UNAVAILABLE: failed to connect to all addresses; last error: ipv4:10.0.0.3:8476")),
        "XlaRuntimeError: UNAVAILABLE: failed to connect",
        id="jax-unavailable-in-task-as-instance-of-cause",
    ),
    pytest.param(
        task_error(RuntimeError("[../gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.3]:41234")),
        "RuntimeError: [../gloo/transport/tcp/pair.cc:598] Connection closed by peer",
        id="gloo-connection-closed-in-task",
    ),
    pytest.param(
        task_error(XlaRuntimeError("INTERNAL: Gloo all-reduce failed: Connection reset by peer")),
        "XlaRuntimeError: INTERNAL: Gloo all-reduce failed",
        id="connection-reset-in-task",
    ),
    pytest.param(
        task_error(with_cause(RuntimeError("train step 12 failed"), XlaRuntimeError("DEADLINE_EXCEEDED: coordination service heartbeat"))),
        "XlaRuntimeError: DEADLINE_EXCEEDED: coordination service",  # the reason names the peer error
        id="peer-error-reraised-by-user-code",
    ),
    pytest.param(task_error(rx.NodeDiedError("node gone")), "NodeDiedError: node gone", id="node-died-inside-task-error"),
]


@pytest.mark.parametrize("error, reason_start", HOST_LOST_CASES)
def test_a_lost_host_and_its_collateral_errors_are_host_lost(error, reason_start):
    outcome = classify(error)
    assert isinstance(outcome, HostLost), outcome
    assert outcome.kind == "host-lost"
    assert outcome.reason.startswith(reason_start), outcome.reason


# A node Ray drained (the SIGTERM of a preemption notice or an eviction) before it went: preempted,
# a kind of its own beside a host lost with no notice, under the same --max-preemptions.
PREEMPTED_CASES = [
    pytest.param(actor_died(preempted=True), "ActorDiedError: The actor died unexpectedly", id="actor-died-preempted"),
    pytest.param(rx.RayActorError(preempted=True), "RayActorError: ", id="actor-error-preempted"),
]


@pytest.mark.parametrize("error, reason_start", PREEMPTED_CASES)
def test_a_host_lost_after_its_notice_is_preempted_not_host_lost(error, reason_start):
    outcome = classify(error)
    assert isinstance(outcome, Preempted), outcome
    assert outcome.kind == "preempted" and outcome.saved_step is None
    assert outcome.reason.startswith(reason_start), outcome.reason
    # Its node is gone by the time the driver looks: the notice still decides.
    assert isinstance(classify(error, dead_hosts=DEAD), Preempted)


INFRA_FAILURE_CASES = [
    pytest.param(rx.WorkerCrashedError(), "WorkerCrashedError: The worker died unexpectedly", id="worker-crashed"),
    pytest.param(
        rx.OutOfMemoryError("Task was killed due to the node running low on memory."),
        "OutOfMemoryError: Task was killed due to the node running low on memory.",
        id="out-of-memory",
    ),
    pytest.param(actor_died(preempted=False), "ActorDiedError: The actor died unexpectedly", id="actor-died-not-preempted"),
    pytest.param(TimeoutError("the per-host tasks did not finish within 60s"), "TimeoutError: the per-host tasks", id="our-timeout"),
    pytest.param(rx.GetTimeoutError("Get timed out: some object(s) not ready."), "GetTimeoutError: Get timed out", id="ray-get-timeout"),
    pytest.param(rx.RaySystemError("the GCS went away"), "RaySystemError: ", id="ray-system-error"),
    pytest.param(
        ReservationError("slice 0 (tpu-a) got worker ids [0, 0, 1, 2], expected 0..3; two bundles share a node"),
        "slice 0 (tpu-a) got worker ids [0, 0, 1, 2], expected 0..3; two bundles share a node",
        id="reservation-error",
    ),
    pytest.param(task_error(rx.WorkerCrashedError()), "WorkerCrashedError: ", id="worker-crashed-inside-task-error"),
]


@pytest.mark.parametrize("error, reason_start", INFRA_FAILURE_CASES)
def test_infrastructure_failures_are_failed_but_not_user_errors(error, reason_start):
    outcome = classify(error)
    assert isinstance(outcome, Failed), outcome
    assert (outcome.user_error, outcome.no_slice, outcome.kind) == (False, False, "failed")
    assert outcome.reason.startswith(reason_start), outcome.reason


USER_ERROR_CASES = [
    pytest.param(task_error(ValueError("learning rate must be positive, got -0.1")), id="value-error-in-task"),
    pytest.param(dual_task_error(ValueError("learning rate must be positive, got -0.1")), id="value-error-in-task-as-instance-of-cause"),
    pytest.param(ValueError("learning rate must be positive, got -0.1"), id="value-error-in-the-driver"),
]


@pytest.mark.parametrize("error", USER_ERROR_CASES)
def test_an_exception_from_the_jobs_own_code_is_a_user_error_naming_what_was_raised(error):
    outcome = classify(error)
    assert isinstance(outcome, Failed), outcome
    assert (outcome.user_error, outcome.no_slice, outcome.kind) == (True, False, "user-error")
    # What the job raised, not Ray's wrapper or the traceback.
    assert outcome.reason == "ValueError: learning rate must be positive, got -0.1"


def test_a_user_errors_reason_is_the_first_line_of_its_message():
    outcome = classify(task_error(KeyError("params/dense_3/kernel")))
    assert outcome == Failed("KeyError: 'params/dense_3/kernel'", user_error=True)
    multi = classify(task_error(ValueError("shapes do not match\n  (8, 128) vs (8, 256)\n  in layer 3")))
    assert multi.reason == "ValueError: shapes do not match"
    assert classify(task_error(AssertionError())).reason == "AssertionError"


CANCEL_CASES = [
    pytest.param(rx.TaskCancelledError(), "TaskCancelledError", id="task-cancelled"),
    pytest.param(
        rx.TaskCancelledError(error_message="cancelled by `ray job stop`"),
        "TaskCancelledError: cancelled by `ray job stop`",
        id="task-cancelled-with-message",
    ),
    pytest.param(KeyboardInterrupt(), "KeyboardInterrupt", id="keyboard-interrupt"),
    pytest.param(asyncio.CancelledError(), "CancelledError", id="asyncio-cancelled"),
    pytest.param(task_error(rx.TaskCancelledError()), "TaskCancelledError", id="task-cancelled-inside-task-error"),
    # Ctrl-C while the driver was handling a lost host: the user asked to stop, so nothing reruns.
    pytest.param(
        with_context(KeyboardInterrupt(), rx.NodeDiedError("node gone")), "KeyboardInterrupt", id="ctrl-c-while-handling-a-lost-host"
    ),
]


@pytest.mark.parametrize("error, reason", CANCEL_CASES)
def test_cancellations_are_cancelled(error, reason):
    outcome = classify(error)
    assert outcome == Cancelled(reason)
    assert outcome.kind == "cancelled"


def test_no_whole_slice_in_time_is_a_no_slice_failure_even_though_its_text_mentions_lost_hosts():
    error = slice_unavailable()
    outcome = classify(error)
    assert isinstance(outcome, Failed), outcome
    assert outcome.no_slice and not outcome.user_error
    assert outcome.reason == str(error)  # the whole inventory, not just its first line


def test_a_cycle_in_the_exception_chain_terminates():
    first, second = ValueError("first"), RuntimeError("second")
    first.__context__, second.__context__ = second, first
    assert classify(first) == Failed("ValueError: first", user_error=True)
    first.__cause__ = first
    assert classify(first) == Failed("ValueError: first", user_error=True)


# --- dead_hosts: a reserved host no longer alive when the run failed ----------------------------

DEAD = ("worker 1 of slice tpu-a", "worker 3 of slice tpu-b")


@pytest.mark.parametrize(
    "error, first_line",
    [
        pytest.param(task_error(ValueError("loss is nan")), "ValueError: loss is nan", id="user-error"),
        pytest.param(rx.WorkerCrashedError(), "WorkerCrashedError: The worker died unexpectedly", id="worker-crashed"),
        pytest.param(TimeoutError("the per-host tasks did not finish within 60s"), "TimeoutError: the per-host tasks", id="timeout"),
        pytest.param(ReservationError("two bundles share a node"), "ReservationError: two bundles share a node", id="reservation"),
        pytest.param(actor_died(preempted=False), "ActorDiedError: ", id="actor-died"),
    ],
)
def test_dead_hosts_make_any_failure_a_lost_host_naming_them_and_the_error(error, first_line):
    outcome = classify(error, dead_hosts=DEAD)
    assert isinstance(outcome, HostLost), outcome
    for host in DEAD:
        assert host in outcome.reason
    assert first_line in outcome.reason


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(KeyboardInterrupt(), id="keyboard-interrupt"),
        pytest.param(rx.TaskCancelledError(), id="task-cancelled"),
        pytest.param(with_context(KeyboardInterrupt(), rx.NodeDiedError("node gone")), id="ctrl-c-while-handling"),
    ],
)
def test_dead_hosts_do_not_override_a_cancellation(error):
    assert isinstance(classify(error, dead_hosts=DEAD), Cancelled)


def test_dead_hosts_do_not_turn_no_slice_into_a_lost_host():
    # The reservation never got a slice, so no host of this attempt can have been lost.
    outcome = classify(slice_unavailable(), dead_hosts=DEAD)
    assert isinstance(outcome, Failed) and outcome.no_slice


def test_no_dead_hosts_means_the_exception_decides():
    error = task_error(ValueError("loss is nan"))
    assert classify(error, dead_hosts=()) == classify(error) == Failed("ValueError: loss is nan", user_error=True)


# --- marker words in a traceback are not the error's own words ------------------------------------


def _read_megascale_env(step: int) -> None:
    raise KeyError(f"metrics/step_{step}")


def test_a_marker_word_in_the_traceback_only_does_not_make_a_user_error_a_lost_host():
    error = task_error(raised_from(_read_megascale_env, 12))
    assert "megascale" in str(error).lower()  # the traceback mentions it...
    assert "megascale" not in str(error.cause).lower()  # ...the error itself does not
    assert classify(error) == Failed("KeyError: 'metrics/step_12'", user_error=True)


# --- Ray Train: what `fit()` raises (real `ray.train.v2` classes) --------------------------------


def user_exception(fn, *args) -> UserExceptionWithTraceback:
    """What a Ray Train worker keeps when its training function raised: the exception, and its
    traceback as text (file, function and source lines)."""
    error = raised_from(fn, *args)
    return UserExceptionWithTraceback(error, "".join(traceback.format_exception(error)))


def _train_step(message: str, error_type: type = ValueError) -> None:
    raise error_type(message)


def health_check_failed(failure: BaseException) -> WorkerHealthCheckFailedError:
    """A worker whose poll failed (its actor died), as Ray Train's worker group reports it."""
    return WorkerHealthCheckFailedError("A worker health check failed.\nWorker info: Worker(rank=0)", failure=failure)


def worker_group_error(failures: dict) -> WorkerGroupError:
    text = "\n".join(f"[Rank {rank} Error Snippet]:\n{error}" for rank, error in failures.items())
    return WorkerGroupError(text, worker_failures=failures)


def preemption_error() -> PreemptionError:
    return PreemptionError(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node-b": [3, 2]}))


def user_value_error() -> UserExceptionWithTraceback:
    return user_exception(_train_step, "learning rate must be positive, got -0.1")


RAY_TRAIN_USER_ERROR_CASES = [
    pytest.param(worker_group_error({0: user_value_error()}), id="one-rank"),
    pytest.param(worker_group_error({r: user_value_error() for r in range(4)}), id="every-rank"),
    pytest.param(user_value_error(), id="user-exception-alone"),
]


@pytest.mark.parametrize("error", RAY_TRAIN_USER_ERROR_CASES)
def test_a_training_functions_exception_is_a_user_error_naming_it_not_the_wrapper(error):
    outcome = classify(error)
    assert outcome == Failed("ValueError: learning rate must be positive, got -0.1", user_error=True)
    assert outcome.kind == "user-error"


def _read_megascale_env_in_train(step: int) -> None:
    raise KeyError(f"metrics/step_{step}")


def test_a_marker_word_in_a_training_traceback_only_does_not_make_a_user_error_a_lost_host():
    wrapped = user_exception(_read_megascale_env_in_train, 12)
    assert "megascale" in str(wrapped).lower()  # its text is the traceback, which mentions it...
    assert "megascale" not in str(wrapped._base_exc).lower()  # ...the error itself does not
    for error in (wrapped, worker_group_error({0: wrapped, 1: wrapped})):
        assert classify(error) == Failed("KeyError: 'metrics/step_12'", user_error=True)


RAY_TRAIN_HOST_LOST_CASES = [
    pytest.param(
        worker_group_error(
            {
                0: user_exception(_train_step, "DEADLINE_EXCEEDED: Barrier timed out. Id: step_12", XlaRuntimeError),
                1: health_check_failed(actor_died(preempted=False)),
                2: user_exception(_train_step, "INTERNAL: Gloo all-reduce failed: Connection reset by peer", XlaRuntimeError),
            }
        ),
        "XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out",
        id="one-rank-died-the-others-lost-their-peer",
    ),
    pytest.param(
        worker_group_error(
            {
                0: health_check_failed(actor_died(preempted=False)),
                1: XlaRuntimeError("INTERNAL: Gloo all-reduce failed: Connection reset by peer"),
            }
        ),
        "XlaRuntimeError: INTERNAL: Gloo all-reduce failed",
        id="peer-error-unwrapped-as-ray-train-delivers-it",
    ),
    pytest.param(
        ControllerError(worker_group_error({0: health_check_failed(rx.NodeDiedError("node 10.0.0.3 is dead"))})),
        "NodeDiedError: node 10.0.0.3 is dead",
        id="node-died-under-the-controller",
    ),
]


RAY_TRAIN_PREEMPTED_CASES = [
    pytest.param(
        preemption_error(), "PreemptionError: Training was interrupted by node preemption (preempted_ranks=[2, 3]", id="preemption"
    ),
    pytest.param(
        worker_group_error({1: health_check_failed(actor_died(preempted=True))}),
        "ActorDiedError: The actor died unexpectedly",
        id="worker-on-a-preempted-node",
    ),
]


@pytest.mark.parametrize("error, reason_start", RAY_TRAIN_PREEMPTED_CASES)
def test_ray_trains_preemption_errors_are_preempted(error, reason_start):
    outcome = classify(error)
    assert isinstance(outcome, Preempted), outcome
    assert outcome.reason.startswith(reason_start), outcome.reason


@pytest.mark.parametrize("error, reason_start", RAY_TRAIN_HOST_LOST_CASES)
def test_ray_train_preemptions_and_peers_of_a_dead_rank_are_host_lost(error, reason_start):
    outcome = classify(error)
    assert isinstance(outcome, HostLost), outcome
    assert outcome.reason.startswith(reason_start), outcome.reason


RAY_TRAIN_INFRA_CASES = [
    pytest.param(
        worker_group_error({2: health_check_failed(actor_died(preempted=False))}),
        "ActorDiedError: The actor died unexpectedly",
        id="worker-actor-died",
    ),
    pytest.param(
        worker_group_error({0: health_check_failed(rx.WorkerCrashedError())}),
        "WorkerCrashedError: The worker died unexpectedly",
        id="worker-crashed",
    ),
    pytest.param(
        ControllerError(RuntimeError("callback on_worker_group_start failed")),
        "ControllerError: Training failed due to controller error",
        id="controller-runtime-error",
    ),
    pytest.param(
        ControllerError(ValueError("snapshot version 3 is not supported")),
        "ControllerError: Training failed due to controller error",
        id="controller-value-error-is-ray-trains-not-the-jobs",
    ),
    pytest.param(
        ControllerError(CheckpointManagerInitializationError("the snapshot references missing checkpoints")),
        "ControllerError: ",
        id="controller-checkpoint-manager",
    ),
    pytest.param(
        NCCLHangError("NCCL RAS reports a hung collective", worker_failures={}),
        "NCCLHangError: Training failed due to worker errors",
        id="worker-group-error-without-failures",
    ),
]


@pytest.mark.parametrize("error, reason_start", RAY_TRAIN_INFRA_CASES)
def test_ray_train_crashes_and_its_own_errors_are_failed_but_not_user_errors(error, reason_start):
    outcome = classify(error)
    assert isinstance(outcome, Failed), outcome
    assert (outcome.user_error, outcome.no_slice, outcome.kind) == (False, False, "failed")
    assert outcome.reason.startswith(reason_start), outcome.reason


def _controller_error_from(cause: BaseException) -> ControllerError:
    """`raise ControllerError(e) from e`, as Ray Train's callback manager does."""
    try:
        raise ControllerError(cause) from cause
    except ControllerError as caught:
        return caught


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ControllerError(WorkerGroupStartupTimeoutError(num_workers=4)), id="controller-error"),
        pytest.param(_controller_error_from(WorkerGroupStartupTimeoutError(num_workers=4)), id="raised-from"),
        pytest.param(WorkerGroupStartupTimeoutError(num_workers=4), id="alone"),
    ],
)
def test_ray_train_not_starting_a_whole_worker_group_in_time_is_no_slice(error):
    outcome = classify(error)
    assert isinstance(outcome, Failed), outcome
    assert outcome.no_slice and not outcome.user_error
    assert outcome.reason.startswith("WorkerGroupStartupTimeoutError: The worker group startup timed out"), outcome.reason
    assert "4 workers" in outcome.reason
    # No host of this attempt can have been lost: it never had its workers.
    assert classify(error, dead_hosts=DEAD) == outcome


@pytest.mark.parametrize(
    "error, first_line",
    [
        pytest.param(
            worker_group_error({1: health_check_failed(actor_died(preempted=False))}),
            "WorkerGroupError: Training failed due to worker errors",
            id="worker-actor-died",
        ),
        pytest.param(
            ControllerError(RuntimeError("callback failed")), "ControllerError: Training failed due to controller error", id="controller"
        ),
    ],
)
def test_dead_hosts_make_a_ray_train_failure_a_lost_host_naming_them(error, first_line):
    outcome = classify(error, dead_hosts=DEAD)
    assert isinstance(outcome, HostLost), outcome
    for host in DEAD:
        assert host in outcome.reason
    assert first_line in outcome.reason


# --- as Ray really delivers them: unwrapped by Ray Train, serialized by Ray -------------------------


def test_a_user_error_as_ray_train_really_delivers_it_is_a_user_error():
    statuses = {rank: WorkerStatus(running=False, error=user_value_error()) for rank in range(2)}
    error = WorkerGroupPollStatus(statuses).get_worker_group_error()
    assert isinstance(error.worker_failures[0], ValueError)  # unwrapped: no UserExceptionWithTraceback left
    assert classify(error) == Failed("ValueError: learning rate must be positive, got -0.1", user_error=True)


def test_a_peer_error_reraised_by_user_code_is_still_a_lost_host_after_rays_serialization():
    error = task_error(with_cause(RuntimeError("train step 12 failed"), XlaRuntimeError("DEADLINE_EXCEEDED: coordination service")))
    received = ray_cloudpickle.loads(ray_cloudpickle.dumps(error))  # what the driver's ray.get gets
    assert received.cause.__cause__ is None and "DEADLINE_EXCEEDED" in str(received)
    assert isinstance(classify(received), HostLost)
