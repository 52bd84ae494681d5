"""`python -m jobs.local preempt --state-dir DIR`: evict the RayJob that `python -m jobs.local rayjob
FILE --state-dir DIR` runs, as Kueue evicts a lower-priority job (it suspends the RayJob; KubeRay
deletes its cluster and, once admitted again, runs the entrypoint anew). The RayJob's process says
where it stands in `<state-dir>/rayjob.json`; the eviction is SIGUSR1 to it, and it is delivered
once the RayJob has been Suspended (its cluster gone), waited for up to `timeout_s`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

from jobs.local.processes import alive
from jobs.runtime.deadlines import Deadline

CONTROL_FILE = "rayjob.json"
TIMEOUT_S = 120.0


class PreemptError(RuntimeError):
    """The eviction could not be delivered; the message says why."""


def control(state_dir: str | Path) -> dict[str, Any] | None:
    """What `<state-dir>/rayjob.json` says of the RayJob run from there, when its process is alive."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        data = json.loads(Path(state_dir, CONTROL_FILE).read_text())
        if isinstance(data, dict) and alive(int(data.get("pid", 0))):
            return data
    return None


def write_control(state_dir: str | Path, name: str, status: str, evictions: int) -> None:
    """The RayJob's process says where it stands, whole or not at all."""
    path = Path(state_dir, CONTROL_FILE)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "name": name, "status": status, "evictions": evictions}))
        tmp.replace(path)


def preempt(state_dir: str | Path, timeout_s: float = TIMEOUT_S) -> str:
    """Evict the running RayJob and wait until it is Suspended; what happened, in a line."""
    before = control(state_dir)
    if before is None:
        raise PreemptError(f"no RayJob is running from {state_dir}; `python -m jobs.local rayjob FILE --state-dir {state_dir}` runs one")
    if before.get("status") not in ("Initializing", "Running"):
        raise PreemptError(f"RayJob {before.get('name')} is {before.get('status') or 'New'}, not admitted and running: nothing to evict")
    os.kill(int(before["pid"]), signal.SIGUSR1)
    deadline = Deadline(timeout_s)
    while not deadline.expired():
        now = control(state_dir)
        if now is None:
            raise PreemptError(f"RayJob {before.get('name')} ended before its eviction was delivered")
        if int(now.get("evictions", 0)) > int(before.get("evictions", 0)):
            return f"evicted RayJob {before['name']}: Suspended, its cluster deleted; it is admitted again on a new cluster"
        deadline.sleep(0.5)
    raise PreemptError(f"RayJob {before.get('name')} was not Suspended within {timeout_s:g} s of its eviction")
