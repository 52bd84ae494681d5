"""A run's goodput ledger: its events appended to `<run dir>/goodput.jsonl`, local or `gs://`
(what `jobs.runtime.goodput.account` reads; the events are listed there).

One writer per run: a `LedgerWriter` actor on the driver's node (a lost TPU host must not take it
along), which the driver and rank 0 of every attempt send their events to. One writer, because a
GCS object cannot be appended to: on `gs://` the actor keeps the ledger's lines and rewrites the
object at most every `FLUSH_S` seconds and when the driver closes it; a local ledger gets each line
as it comes. Sending is fire-and-forget and never raises: a ledger that cannot be written costs the
run its goodput figures, not its training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import Any

from jobs.runtime import storage
from jobs.runtime.goodput import LedgerError

LEDGER_FILE = "goodput.jsonl"
FLUSH_S = 5.0  # on gs://: how stale the object may be while the run goes on
CLOSE_TIMEOUT_S = 30.0

_log = logging.getLogger("jobs.runtime")


def ledger_uri(run_dir: str) -> str:
    return storage.join(run_dir, LEDGER_FILE)


def parse(text: str, where: str) -> list[dict[str, Any]]:
    """The events of a ledger's text; LedgerError names the line that is not one (pure). A last line
    cut short (a writer stopped mid-line) is left out."""
    lines = text.splitlines()
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not text.endswith("\n"):
                break
            raise LedgerError(f"{where} line {number} is not JSON: {line[:80]!r}") from None
        out.append(event)
    return out


def read_events(uri: str) -> list[dict[str, Any]]:
    """The events in the ledger at `uri`; StorageError when there is none."""
    return parse(storage.read_bytes(uri).decode(), uri)


class LedgerWriter:
    """The one writer of a run's ledger (a Ray actor, num_cpus=0)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.remote = storage.is_remote(uri)
        self.lines: list[str] = []
        self.dirty = False
        self.lock = threading.Lock()
        if self.remote:
            with contextlib.suppress(storage.StorageError):  # a rerun of the run continues its ledger
                self.lines = storage.read_bytes(uri).decode().splitlines(keepends=True)
            threading.Thread(target=self._flush_every, daemon=True).start()
        else:
            os.makedirs(os.path.dirname(uri), exist_ok=True)

    def record(self, *events: dict[str, Any]) -> None:
        lines = [json.dumps(e, sort_keys=True) + "\n" for e in events]
        with self.lock:
            if self.remote:
                self.lines.extend(lines)
                self.dirty = True
                return
            try:
                with open(self.uri, "a") as f:
                    f.writelines(lines)
            except OSError as err:
                _log.warning("the goodput ledger %s could not be written: %s", self.uri, err)

    def flush(self) -> None:
        with self.lock:
            if not (self.remote and self.dirty):
                return
            data = "".join(self.lines).encode()
            self.dirty = False
        try:
            storage.write_bytes(self.uri, data)
        except storage.StorageError as err:
            _log.warning("the goodput ledger could not be written: %s", err)

    def _flush_every(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            self.flush()


class Ledger:
    """The driver's side: start the writer, send events, hand the writer to the workers, close."""

    def __init__(self, handle: Any, earlier_attempts: int = 0) -> None:
        self.handle = handle
        self.earlier_attempts = earlier_attempts

    @classmethod
    def open(cls, run_dir: str) -> Ledger:
        """The run's ledger, continued: a run resubmitted under the same name numbers its attempts
        after those already there."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        uri = ledger_uri(run_dir)
        earlier = 0
        with contextlib.suppress(storage.StorageError, LedgerError):
            earlier = max((int(e.get("attempt", 0)) for e in read_events(uri) if isinstance(e, dict)), default=0)
        here = NodeAffinitySchedulingStrategy(_head_or_own_node(), soft=True)
        # A writer that dies (its node lost after all, its process killed under memory pressure) is
        # started again, elsewhere if need be, and the events sent meanwhile go to the new one: it
        # continues the ledger, as a rerun does.
        actor = ray.remote(LedgerWriter).options(num_cpus=0, scheduling_strategy=here, max_restarts=-1, max_task_retries=-1)
        return cls(actor.remote(uri), earlier)

    def attempt(self, number: int) -> int:
        """The ledger's number for this job's attempt `number` (from 1)."""
        return self.earlier_attempts + number

    def record(self, event: str, **fields: Any) -> None:
        record(self.handle, event, **fields)

    def close(self) -> None:
        """Write what is buffered (bounded), then end the writer."""
        import ray

        with contextlib.suppress(Exception):
            ray.get(self.handle.flush.remote(), timeout=CLOSE_TIMEOUT_S)
        with contextlib.suppress(Exception):
            ray.kill(self.handle)


def _head_or_own_node() -> str:
    """The head node (where the driver of a submitted job runs, and which no TPU host loss takes
    along), else this process's node. A driver connected from outside can be attached to any
    raylet of its machine: on the simulation, a TPU host's."""
    import ray

    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return str(node["NodeID"])
    return str(ray.get_runtime_context().get_node_id())


def record(handle: Any, event: str, **fields: Any) -> None:
    """Send one event, stamped now, to the ledger's writer `handle` (None: no ledger); never raises."""
    if handle is None:
        return
    with contextlib.suppress(Exception):
        handle.record.remote({"t": time.time(), "event": event, **fields})
