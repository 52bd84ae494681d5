"""The run driver's pure parts: `decide` (what reruns, against which budget, and the exact
boundaries), `lost_hosts` and `watched_hosts` on hand-built `ray.nodes()` entries, `may_be_node_death`,
`RetryBudget.from_args` through the real CLI flags, how an `Attempt` and a `RunReport` read, the
`retry` loop driven by scripted outcomes, and what `report_failure`/`print_attempts` print."""

from __future__ import annotations

import argparse

import pytest
import ray.exceptions as rx

from infra import catalog
from jobs import cli
from jobs.cli import add_fault_flags, report_failure
from jobs.runtime.inventory import SliceUnavailableError
from jobs.runtime.labels import POD_TYPE_LABEL, SLICE_NAME_LABEL, WORKER_ID_LABEL
from jobs.runtime.outcomes import Cancelled, Failed, HostLost, NoProgressError, Succeeded
from jobs.runtime.reruns import (
    INTERRUPTED,
    Attempt,
    RetryBudget,
    RunReport,
    WatchedHost,
    attempt_outcome,
    decide,
    lost_hosts,
    may_be_node_death,
    retry,
    watched_hosts,
)
from jobs.runtime.reservation import Host, ReservationError

LOST = HostLost("NodeDiedError: node 10.0.0.3 died")
CRASH = Failed("WorkerCrashedError: The worker died unexpectedly", user_error=False)
USER = Failed("ValueError: loss is nan", user_error=True)
NO_SLICE = Failed("could not reserve 1 x v6e 4x4 slice(s)", user_error=False, no_slice=True)
CANCELLED = Cancelled("KeyboardInterrupt")


def rerun_after(history, budget):
    """Whether `decide` reruns after the last outcome of `history` (all outcomes so far)."""
    return decide(history[-1], history, budget) is None


# --- decide ---------------------------------------------------------------------------------------


def test_host_lost_reruns_exactly_max_preemptions_times():
    budget = RetryBudget(max_preemptions=2, max_failures=0)
    assert rerun_after([LOST], budget)  # 1st lost host: rerun
    assert rerun_after([LOST, LOST], budget)  # 2nd: rerun
    why = decide(LOST, [LOST, LOST, LOST], budget)  # 3rd: the budget is spent
    assert why is not None
    assert "3 host-lost" in why and "--max-preemptions 2" in why


def test_infrastructure_failures_rerun_exactly_max_failures_times():
    budget = RetryBudget(max_preemptions=0, max_failures=1)
    assert rerun_after([CRASH], budget)
    why = decide(CRASH, [CRASH, CRASH], budget)
    assert why is not None and "--max-failures 1" in why and "--max-preemptions" not in why


def test_zero_budgets_rerun_nothing_and_name_the_flag_to_raise():
    budget = RetryBudget(max_preemptions=0, max_failures=0)
    assert "--max-preemptions 0" in decide(LOST, [LOST], budget)
    assert "--max-failures 0" in decide(CRASH, [CRASH], budget)


def test_the_default_budget_reruns_lost_hosts_but_not_failures():
    budget = RetryBudget()
    assert rerun_after([LOST], budget)
    assert not rerun_after([CRASH], budget)


def test_the_two_budgets_are_counted_separately():
    budget = RetryBudget(max_preemptions=1, max_failures=1)
    # A failure does not use up the lost-host budget, nor a lost host the failure budget.
    assert rerun_after([CRASH, LOST], budget)
    assert rerun_after([LOST, CRASH], budget)
    assert not rerun_after([CRASH, LOST, LOST], budget)
    assert not rerun_after([LOST, CRASH, CRASH], budget)


def test_user_errors_and_no_slice_failures_are_not_charged_to_the_failure_budget():
    budget = RetryBudget(max_preemptions=5, max_failures=1)
    # Earlier user errors cannot be in a real history (they end the run), but they must not count.
    assert rerun_after([USER, USER, CRASH], budget)


@pytest.mark.parametrize(
    "outcome, says",
    [
        pytest.param(USER, "user error", id="user-error"),
        pytest.param(NO_SLICE, "--reserve-timeout", id="no-slice"),
        pytest.param(CANCELLED, "cancelled", id="cancelled"),
        pytest.param(Succeeded([1, 2, 3, 4]), "succeeded", id="succeeded"),
    ],
)
def test_what_never_reruns_however_large_the_budgets(outcome, says):
    budget = RetryBudget(max_preemptions=100, max_failures=100)
    why = decide(outcome, [outcome], budget)
    assert why is not None and says in why


def test_a_lost_host_reruns_after_earlier_failures_of_other_kinds():
    budget = RetryBudget(max_preemptions=1, max_failures=0)
    assert rerun_after([CRASH, CRASH, CRASH, LOST], budget)


# --- lost_hosts -----------------------------------------------------------------------------------


def host(process_id, slice_name, worker_id, node_id):
    return Host(process_id, 0, slice_name, worker_id, process_id, node_id, f"10.0.0.{process_id + 1}")


def ray_node(node_id, alive):
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "10.0.0.9", "Resources": {"TPU": 4.0}}


HOSTS = (host(0, "tpu-a", 0, "n0"), host(1, "tpu-a", 1, "n1"), host(2, "tpu-a", 2, "n2"), host(3, "tpu-a", 3, "n3"))


def test_no_host_is_lost_while_every_node_is_alive():
    assert lost_hosts(HOSTS, [ray_node(f"n{i}", True) for i in range(4)] + [ray_node("other", False)]) == []


def test_a_dead_node_and_a_node_gone_from_the_list_are_both_lost_hosts():
    nodes = [ray_node("n0", True), ray_node("n1", False), ray_node("n3", True)]  # n2 is not listed at all
    assert lost_hosts(HOSTS, nodes) == ["worker 1 of slice tpu-a", "worker 2 of slice tpu-a"]


def test_lost_hosts_are_described_by_slice_and_worker_id_not_by_node():
    hosts = (host(0, "tpu-a", 0, "a0"), host(1, "tpu-b", 0, "b0"))
    assert lost_hosts(hosts, [ray_node("a0", True), {"NodeID": "b0"}]) == ["worker 0 of slice tpu-b"]
    assert lost_hosts(hosts, []) == ["worker 0 of slice tpu-a", "worker 0 of slice tpu-b"]
    assert lost_hosts((), [ray_node("a0", False)]) == []


# --- may_be_node_death ----------------------------------------------------------------------------


def task_error(cause):
    """What `ray.get` raises when a task raised `cause`."""
    traceback_str = f"Traceback (most recent call last):\n{type(cause).__name__}: {cause}"
    return rx.RayTaskError("host_task", traceback_str, cause, proctitle="ray::host_task", pid=1, ip="10.0.0.2")


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(rx.WorkerCrashedError(), id="worker-crashed"),
        pytest.param(rx.NodeDiedError("node died"), id="node-died"),
        pytest.param(rx.OutOfMemoryError("killed for memory"), id="out-of-memory"),
        pytest.param(task_error(RuntimeError("UNAVAILABLE: Connection reset by peer")), id="broken-collective"),
        pytest.param(ReservationError("two bundles share a node"), id="reservation-error"),
    ],
)
def test_crashes_and_broken_collectives_may_be_a_dying_node(error):
    assert may_be_node_death(error) is True


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(task_error(ValueError("loss is nan")), id="user-error"),
        pytest.param(ValueError("bad flag"), id="driver-user-error"),
        pytest.param(KeyboardInterrupt(), id="keyboard-interrupt"),
        pytest.param(rx.TaskCancelledError(), id="task-cancelled"),
        pytest.param(TimeoutError("the per-host tasks did not finish within 60s"), id="our-timeout"),
        pytest.param(NoProgressError("no progress within --step-timeout 30s"), id="no-progress"),
        pytest.param(rx.GetTimeoutError("Get timed out"), id="ray-get-timeout"),
        pytest.param(SliceUnavailableError("could not reserve", ()), id="slice-unavailable"),
    ],
)
def test_user_errors_cancellations_and_our_own_timeouts_are_not_a_dying_node(error):
    assert may_be_node_death(error) is False


# --- RetryBudget, Attempt, RunReport ---------------------------------------------------------------


def test_retry_budget_from_the_cli_flags():
    parser = argparse.ArgumentParser()
    add_fault_flags(parser, step_timeout_s=600.0, max_failures=0, max_preemptions=3)
    assert RetryBudget.from_args(parser.parse_args([])) == RetryBudget(max_preemptions=3, max_failures=0)
    args = parser.parse_args(["--max-preemptions", "7", "--max-failures", "2"])
    assert RetryBudget.from_args(args) == RetryBudget(max_preemptions=7, max_failures=2)


def test_retry_budget_from_a_plain_namespace():
    args = argparse.Namespace(max_preemptions=0, max_failures=4, step_timeout=30.0, slices=2)
    assert RetryBudget.from_args(args) == RetryBudget(max_preemptions=0, max_failures=4)


def test_a_failed_attempt_says_where_what_how_long_and_why():
    attempt = Attempt(2, LOST, ("tpu-a", "tpu-b"), "10.0.0.1:8476", 12.34, reserve_s=3.0)
    assert attempt.describe() == (
        "attempt 2 on tpu-a, tpu-b (coordinator 10.0.0.1:8476): host-lost after 12.3s: NodeDiedError: node 10.0.0.3 died"
    )
    user = Attempt(1, USER, ("tpu-a",), "10.0.0.1:8476", 0.96).describe()
    assert "user-error after 1.0s: ValueError: loss is nan" in user


def test_an_attempt_that_never_got_a_slice_names_none():
    text = Attempt(1, NO_SLICE, (), None, 600.0).describe()
    assert text == "attempt 1: failed after 600.0s: could not reserve 1 x v6e 4x4 slice(s)"


def test_a_successful_attempt_gives_no_reason():
    text = Attempt(3, Succeeded([0.5, 0.5]), ("tpu-c",), "10.0.0.7:8476", 45.0).describe()
    assert text == "attempt 3 on tpu-c (coordinator 10.0.0.7:8476): succeeded after 45.0s"


def test_a_run_report_after_reruns_is_ok_with_the_value_and_one_line_per_attempt():
    attempts = (
        Attempt(1, LOST, ("tpu-a",), "10.0.0.1:8476", 30.0),
        Attempt(2, CRASH, ("tpu-b",), "10.0.0.5:8476", 5.0),
        Attempt(3, Succeeded({"loss": 0.1}), ("tpu-a",), "10.0.0.1:9000", 60.0),
    )
    report = RunReport(attempts[-1].outcome, attempts)
    assert report.ok and report.value == {"loss": 0.1}
    lines = report.describe().splitlines()
    assert lines == [a.describe() for a in attempts]
    assert lines[0].startswith("attempt 1 ") and "host-lost" in lines[0]
    assert lines[2].startswith("attempt 3 ") and "succeeded" in lines[2]


@pytest.mark.parametrize(
    "outcome", [LOST, CRASH, USER, NO_SLICE, CANCELLED], ids=["host-lost", "crash", "user-error", "no-slice", "cancelled"]
)
def test_a_run_report_that_did_not_succeed_is_not_ok_and_has_no_value(outcome):
    report = RunReport(outcome, (Attempt(1, outcome, (), None, 1.0),))
    assert not report.ok and report.value is None


def test_a_successful_run_may_return_a_falsy_value():
    report = RunReport(Succeeded(None), (Attempt(1, Succeeded(None), ("tpu-a",), None, 1.0),))
    assert report.ok and report.value is None
    assert RunReport(Succeeded(0), ()).value == 0 and RunReport(Succeeded(0), ()).ok


# --- watched_hosts --------------------------------------------------------------------------------

SHAPE = catalog.shape("v6e", "4x4")  # pod type v6e-16, 4 hosts


def tpu_node(node_id, slice_name, worker_id, alive=True, pod_type="v6e-16"):
    """A `ray.nodes()` entry of a TPU host, with the labels Ray sets on it."""
    labels = {POD_TYPE_LABEL: pod_type, SLICE_NAME_LABEL: slice_name, WORKER_ID_LABEL: str(worker_id)}
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "10.0.0.9", "Labels": labels}


def test_the_shape_under_test_has_the_pod_type_the_nodes_are_labelled_with():
    assert SHAPE.pod_type == "v6e-16"


def test_watched_hosts_are_the_alive_hosts_of_the_shapes_pod_type_with_slice_and_worker_id():
    nodes = [
        {"NodeID": "head", "Alive": True, "Labels": {}},  # the CPU head node
        tpu_node("a0", "tpu-a", 0),
        tpu_node("a1", "tpu-a", 1),
        tpu_node("a2", "tpu-a", 2, alive=False),  # already dead: not this attempt's to lose
        tpu_node("b3", "tpu-b", 3),
        tpu_node("c0", "tpu-c", 0, pod_type="v6e-64"),  # another shape
        {"NodeID": "cpu", "Alive": True},  # no labels at all
        {"NodeID": "cpu2", "Alive": True, "Labels": None},
    ]
    assert watched_hosts(nodes, SHAPE) == (
        WatchedHost("a0", "tpu-a", 0),
        WatchedHost("a1", "tpu-a", 1),
        WatchedHost("b3", "tpu-b", 3),
    )


def test_watched_hosts_without_a_slice_name_or_a_usable_worker_id_are_still_watched():
    labels = {POD_TYPE_LABEL: "v6e-16"}
    nodes = [
        {"NodeID": "x", "Alive": True, "Labels": labels},
        {"NodeID": "y", "Alive": True, "Labels": {**labels, SLICE_NAME_LABEL: "tpu-a", WORKER_ID_LABEL: "w1"}},
    ]
    assert watched_hosts(nodes, SHAPE) == (WatchedHost("x", "?", -1), WatchedHost("y", "tpu-a", -1))


def test_no_nodes_of_the_shape_means_nothing_watched():
    assert watched_hosts([], SHAPE) == ()
    assert watched_hosts([tpu_node("a0", "tpu-a", 0)], catalog.shape("v6e", "8x8")) == ()


def test_lost_hosts_names_the_watched_hosts_that_died_since():
    before = [tpu_node("a0", "tpu-a", 0), tpu_node("a1", "tpu-a", 1), tpu_node("b2", "tpu-b", 2), tpu_node("b3", "tpu-b", 3)]
    watched = watched_hosts(before, SHAPE)
    assert lost_hosts(watched, before) == []
    later = [tpu_node("a0", "tpu-a", 0), tpu_node("a1", "tpu-a", 1, alive=False), tpu_node("b3", "tpu-b", 3)]  # b2 gone
    assert lost_hosts(watched, later) == ["worker 1 of slice tpu-a", "worker 2 of slice tpu-b"]


# --- retry ----------------------------------------------------------------------------------------


class Script:
    """`attempt_once` for `retry`: returns the next scripted outcome, and records the numbers asked for."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.numbers = []

    def __call__(self, number):
        self.numbers.append(number)
        return Attempt(number, self.outcomes[len(self.numbers) - 1], (), None, 0.0)


def run_script(budget, *outcomes):
    """`retry` over the script: (the report, the numbers attempted, the log lines)."""
    script, lines = Script(*outcomes), []
    report = retry(script, budget, "train demo", lines.append)
    return report, script.numbers, lines


RERUN = "released the slice, rerunning on a whole one"
OK = Succeeded({"loss": 0.1})


def test_retry_stops_at_the_first_success_and_reports_every_attempt():
    report, numbers, lines = run_script(RetryBudget(max_preemptions=3, max_failures=1), LOST, CRASH, OK, LOST)
    assert numbers == [1, 2, 3]
    assert report.ok and report.value == {"loss": 0.1} and report.outcome is OK
    assert [a.number for a in report.attempts] == [1, 2, 3]
    assert [a.outcome for a in report.attempts] == [LOST, CRASH, OK]
    # One line per rerun, and nothing after the success.
    assert len(lines) == 2 and all(line.startswith("train demo: attempt ") and line.endswith(RERUN) for line in lines)
    assert lines[0].startswith("train demo: attempt 1: host-lost") and lines[1].startswith("train demo: attempt 2: failed")


def test_retry_that_succeeds_at_once_runs_once_and_logs_nothing():
    report, numbers, lines = run_script(RetryBudget(), OK)
    assert (numbers, lines) == ([1], [])
    assert report == RunReport(OK, (Attempt(1, OK, (), None, 0.0),))


def test_retry_reruns_lost_hosts_up_to_max_preemptions_then_stops_with_the_budget_message():
    report, numbers, lines = run_script(RetryBudget(max_preemptions=2, max_failures=0), *[LOST] * 5)
    assert numbers == [1, 2, 3]  # two reruns
    assert not report.ok and report.outcome == LOST and len(report.attempts) == 3
    assert lines[:2] == [f"train demo: {report.attempts[i].describe()}; {RERUN}" for i in range(2)]
    assert lines[-1] == f"train demo: {report.attempts[2].describe()}; 3 host-lost fault(s), more than --max-preemptions 2"
    assert len(lines) == 3


@pytest.mark.parametrize(
    "outcome, says",
    [
        pytest.param(USER, "a user error: not rerun", id="user-error"),
        pytest.param(CANCELLED, "cancelled: not rerun", id="cancelled"),
        pytest.param(NO_SLICE, "--reserve-timeout", id="no-slice"),
    ],
)
def test_retry_never_reruns_a_user_error_a_cancellation_or_no_slice(outcome, says):
    report, numbers, lines = run_script(RetryBudget(max_preemptions=100, max_failures=100), outcome, OK)
    assert numbers == [1]
    assert report.outcome is outcome and not report.ok and len(report.attempts) == 1
    assert len(lines) == 1 and lines[0].startswith("train demo: attempt 1: ") and says in lines[0]
    assert RERUN not in lines[0]


def test_retry_after_reruns_stops_at_a_user_error():
    report, numbers, lines = run_script(RetryBudget(max_preemptions=3, max_failures=3), LOST, CRASH, USER, OK)
    assert numbers == [1, 2, 3]
    assert report.outcome is USER and [a.number for a in report.attempts] == [1, 2, 3]
    assert [RERUN in line for line in lines] == [True, True, False]


# --- report_failure and print_attempts --------------------------------------------------------------


@pytest.mark.parametrize(
    "outcome, status",
    [
        pytest.param(LOST, 1, id="host-lost"),
        pytest.param(CRASH, 1, id="crash"),
        pytest.param(USER, 1, id="user-error"),
        pytest.param(NO_SLICE, 1, id="no-slice"),
        pytest.param(CANCELLED, 130, id="cancelled"),
    ],
)
def test_report_failure_prints_one_failed_line_to_stderr_and_returns_the_exit_status(outcome, status, capsys):
    report = RunReport(outcome, (Attempt(1, outcome, (), None, 1.0),))
    assert report_failure(report, "train demo") == status
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"train demo FAILED ({outcome.kind}): {outcome.reason}\n"


def finish(report: RunReport) -> int | None:
    return cli.finish(report, "demo", "DEMO", lambda value: f"summary of {value}", lambda value: {"value": value})


def test_finish_prints_the_summary_and_the_result_line_but_no_attempts_for_a_single_attempt(capsys):
    ok = Succeeded(7)
    assert finish(RunReport(ok, (Attempt(1, ok, ("tpu-a",), None, 3.0),))) is None
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == ["summary of 7", 'DEMO {"value": 7, "attempts": 1}']
    assert cli.parse_result(out, "DEMO") == {"value": 7, "attempts": 1}


def test_finish_prints_each_attempt_after_reruns(capsys):
    ok = Succeeded(7)
    attempts = (Attempt(1, LOST, ("tpu-a",), "10.0.0.1:8476", 30.0), Attempt(2, ok, ("tpu-b",), "10.0.0.5:8476", 60.0))
    assert finish(RunReport(ok, attempts)) is None
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "summary of 7",
        "  attempts:",
        *[f"    {a.describe()}" for a in attempts],
        'DEMO {"value": 7, "attempts": 2}',
    ]


def test_finish_of_a_failed_run_is_report_failure(capsys):
    report = RunReport(LOST, (Attempt(1, LOST, ("tpu-a",), None, 3.0),))
    assert finish(report) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("demo FAILED (host-lost): ")


# --- attempt_outcome: the one error ladder of an attempt -------------------------------------------


class _Stop(Exception):
    pass


def _raise(error: BaseException):
    def run():
        raise error

    return run


def test_attempt_outcome_wraps_a_value_and_keeps_an_outcome():
    assert attempt_outcome(lambda: [1, 2]) == Succeeded([1, 2])
    assert attempt_outcome(lambda: LOST) is LOST


def test_attempt_outcome_turns_each_error_into_the_outcome_it_means():
    no_slice = attempt_outcome(_raise(SliceUnavailableError("no whole slice", ())))
    assert isinstance(no_slice, Failed) and no_slice.no_slice
    assert attempt_outcome(_raise(KeyboardInterrupt())) == Cancelled(INTERRUPTED)
    user = attempt_outcome(_raise(ValueError("bad flag")))
    assert isinstance(user, Failed) and user.user_error and "ValueError: bad flag" in user.reason
    reservation = attempt_outcome(_raise(ReservationError("two bundles share a node")))
    assert isinstance(reservation, Failed) and not reservation.user_error


def test_attempt_outcome_lets_passthrough_errors_propagate():
    with pytest.raises(_Stop):
        attempt_outcome(_raise(_Stop()), passthrough=(_Stop,))


def test_preempted_and_lost_hosts_share_the_max_preemptions_budget():
    from jobs.runtime.outcomes import Preempted

    noticed = Preempted("preemption notice at step 23: saving step 23", saved_step=23)
    budget = RetryBudget(max_preemptions=2, max_failures=0)
    assert rerun_after([noticed], budget) and rerun_after([LOST, noticed], budget)
    why = decide(noticed, [LOST, noticed, noticed], budget)
    assert why is not None and "--max-preemptions 2" in why


def test_an_elastic_resize_always_reruns_and_costs_no_budget():
    from jobs.runtime.outcomes import Resized

    grown = Resized("saved at step 40: growing from 1 to 2 slices", slices=2)
    none = RetryBudget(max_preemptions=0, max_failures=0)
    assert rerun_after([grown], none) and rerun_after([grown, grown, grown], none)
    assert rerun_after([LOST, grown], RetryBudget(max_preemptions=1, max_failures=0))  # the loss counted once
