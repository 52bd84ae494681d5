"""After a test run that failed, print what Ray's own processes said before they died.

A Ray driver exits at once, with status 1 and no Python traceback, when its raylet or the GCS
dies; pytest then prints no summary, and the test clusters' log directories are the only record.
The tests keep Ray's files under /tmp/rayjobs-* (tests/jobs/conftest.py) and /tmp/jl-* (the
`jobs.local` clusters); a run that ends normally deletes them, so what is left after a crash is
the crash. Usage: `python scripts/ray_crash_report.py SINCE_EPOCH_SECONDS` (Makefile: `test`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOTS = ("/tmp/rayjobs-*", "/tmp/jl-*")
# Ray's C++ log lines carry a level letter before the pid: E is an error, C a failed check
# ("[2026-12-03 23:36:44,723 C 1257 1257] (raylet) ...").
FATAL = re.compile(r"^\[\S+ \S+ [EC] \d+ \d+\]|Check failed|\*\*\* SIG")
LOGS = ("raylet*.out", "raylet*.err", "gcs_server.out", "gcs_server.err", "python-core-driver-*.log")
MAX_LINES = 20


def report(since: float) -> int:
    found = 0
    for pattern in ROOTS:
        for root in sorted(Path("/").glob(pattern.lstrip("/"))):
            for logs in root.glob("**/session_*/logs"):
                if logs.parent.name == "session_latest" or logs.stat().st_mtime < since:  # a link to another
                    continue
                for name in LOGS:
                    for path in sorted(logs.glob(name)):
                        hits = [line.rstrip() for line in path.open(errors="replace") if FATAL.search(line)]
                        if hits:
                            found += 1
                            print(f"--- {path} ({len(hits)} lines like this; the last {min(len(hits), MAX_LINES)}):")
                            print("\n".join(hits[-MAX_LINES:]))
    if not found:
        print(f"ray_crash_report: no Ray log written since the run began says a Ray process died ({', '.join(ROOTS)})")
    return 0


if __name__ == "__main__":
    sys.exit(report(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0))
