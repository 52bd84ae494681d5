"""Bounded waits: nothing here waits forever, and every timeout says what it waited for.

deadline = Deadline(30.0)            # remaining(), expired(), elapsed()
value = wait_until(check, 30.0, "the head's dashboard to answer")
value = call_with_timeout(fn, 30.0, "Ray Serve to start")
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Deadline:
    """A bound on a wait, in monotonic time, shared by the steps of one wait."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.started = time.monotonic()
        self.at = self.started + self.seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, but never past the deadline."""
        time.sleep(min(seconds, self.remaining()))


def wait_until(check: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.5) -> T:
    """Call `check()` until it returns something truthy, and return that; after `timeout_s`, raise
    `TimeoutError` naming `what` was waited for. `check` is always called at least once."""
    deadline = Deadline(timeout_s)
    while True:
        value = check()
        if value:
            return value
        if deadline.expired():
            raise TimeoutError(f"waited {timeout_s:.0f}s for {what}")
        deadline.sleep(poll_s)


def call_with_timeout(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """`fn()` in a daemon thread, bounded: its value, or its exception re-raised, or `TimeoutError`
    naming `what` after `timeout_s` (the thread is left behind; it cannot be interrupted)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the caller
            box["error"] = err

    thread = threading.Thread(target=run, name=f"bounded: {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not finish within {timeout_s:.0f}s")
    if "error" in box:
        raise box["error"]
    return box["value"]
