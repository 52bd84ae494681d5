"""The simulation's processes: `ray start --block` in its own process group, and stopping a group
(SIGTERM, a bounded wait, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from jobs.runtime.deadlines import Deadline


def ray_start(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats", *args]
    with open(log, "w") as out:
        # Own session: `down` can signal the node and every process it spawned, and nothing else.
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def tail(path: str | Path, lines: int = 8) -> str:
    with contextlib.suppress(OSError):
        text = Path(path).read_text(errors="replace").strip().splitlines()
        return "\n".join("    " + line for line in text[-lines:])
    return "    (no log)"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:  # a zombie we have not reaped counts as dead
        return f.read().split(") ", 1)[1][:1] != "Z"
    return True


def stop_groups(pids: Sequence[int], grace_s: float) -> None:
    """SIGTERM each node's process group, wait up to `grace_s`, then SIGKILL what is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = Deadline(grace_s)
    while not deadline.expired() and any(_group_alive(p) for p in pids):
        for pid in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        deadline.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Only zombies left (the leader waiting to be reaped) count as gone.
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (proc / "stat").read_text().rsplit(") ", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False
