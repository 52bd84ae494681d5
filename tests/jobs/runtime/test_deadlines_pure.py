"""Bounded waits: `Deadline`, `wait_until` (returns the first truthy value, or says what it waited
for), `call_with_timeout` (a value, the function's own error, or a timeout naming the call)."""

from __future__ import annotations

import threading
import time

import pytest

from jobs.runtime.deadlines import Deadline, call_with_timeout, wait_until


def test_a_deadline_counts_down_and_never_sleeps_past_itself():
    deadline = Deadline(0.2)
    assert 0 < deadline.remaining() <= 0.2 and not deadline.expired()
    started = time.monotonic()
    deadline.sleep(5.0)
    assert time.monotonic() - started < 1.0
    assert deadline.expired() and deadline.remaining() == 0.0 and deadline.elapsed() >= 0.2


def test_wait_until_returns_the_first_truthy_value():
    calls = iter([None, 0, "", "ready", "later"])
    assert wait_until(lambda: next(calls), 5.0, "the thing", poll_s=0.01) == "ready"


def test_wait_until_checks_at_least_once_even_without_time():
    assert wait_until(lambda: 7, 0.0, "the thing") == 7


def test_wait_until_says_what_it_waited_for_when_time_runs_out():
    with pytest.raises(TimeoutError, match="waited 0s for the head's dashboard to answer"):
        wait_until(lambda: False, 0.1, "the head's dashboard to answer", poll_s=0.02)


def test_call_with_timeout_returns_the_value_or_raises_the_functions_own_error():
    assert call_with_timeout(lambda: 3, 5.0, "three") == 3

    def boom() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        call_with_timeout(boom, 5.0, "boom")


def test_call_with_timeout_gives_up_naming_the_call_and_leaves_the_thread_behind():
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="serve.shutdown did not finish within 0s"):
        call_with_timeout(lambda: release.wait(30), 0.2, "serve.shutdown")
    assert time.monotonic() - started < 2.0
    release.set()
