"""Goodput and badput of a training run, finished or not, from its ledger.

    python -m jobs.goodput --storage DIR|gs://... --name RUN [--json]

Reads `<storage>/<run>/goodput.jsonl` (written by `jobs.train`: jobs.runtime.ledger) and prints the
run's goodput (productive step time over the wall time since its first attempt started), its badput
in the categories of Google's ml-goodput-measurement (jobs.runtime.goodput), and each attempt's
timeline. A run still going is counted up to now. Needs no Ray cluster and no slice.

Exit status: 0 printed, 1 no ledger for that run (or one that cannot be read), 2 bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from jobs.runtime import goodput, ledger, storage


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jobs.goodput", description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", required=True, help="the training runs' storage: a directory or gs://... (jobs.train --storage)")
    p.add_argument("--name", required=True, help="the run (jobs.train --name)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object instead")
    return p


def timeline(account: goodput.Goodput) -> str:
    """Each attempt's milestones, in seconds since the first attempt started (pure)."""

    def at(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = []
    for a in account.attempts:
        steps = f"steps {a.steps[0]}-{a.steps[1]}" if a.steps else "no steps"
        resumed = f", resumed from step {a.restored_step}" if a.restored_step is not None else ""
        lines.append(
            f"  attempt {a.attempt}: start {at(a.start)} s, reserved {at(a.reserved)}, workers {at(a.workers_started)}, "
            f"state {at(a.state_built)}, first step {at(a.first_step_start)}, end {at(a.end)} ({a.outcome or 'running'}); "
            f"{steps}{resumed}{a.describe_events()}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    uri = ledger.ledger_uri(storage.join(args.storage, args.name))
    try:
        events = ledger.read_events(uri)
        account = goodput.account(events, now=time.time())
    except storage.StorageError as err:
        print(f"jobs.goodput: no goodput ledger for run {args.name!r} in {args.storage}: {err}", file=sys.stderr)
        return 1
    except goodput.LedgerError as err:
        print(f"jobs.goodput: {uri}: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"run": args.name, **account.as_dict()}))
    else:
        print(f"run {args.name} ({uri})")
        print(account.describe())
        print(timeline(account))
    return 0


if __name__ == "__main__":
    sys.exit(main())
