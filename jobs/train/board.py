"""What a person looks at while a run trains: TensorBoard event files in the run's directory, and a
JAX profiler trace of the steps they ask for.

- `Board`: rank 0's tensorboardX writer into `<run>/tensorboard/` (a local directory or gs://, which
  tensorboardX writes through google-cloud-storage): per step `train/loss`, `train/learning_rate`,
  `train/grad_norm`, `train/step_time_s`, `train/tokens_per_s` and `train/mfu` (where the platform
  has a peak), and the driver's `run/goodput` at the end. `tensorboard --logdir <run>/tensorboard`
  shows them. A rerun (a new attempt, or a resumed run) writes a new event file beside the last.
- `ProfileWindow`: `jobs.train --profile-steps A:B` traces steps A to B (1-based, both included) on
  every host with `jax.profiler`, into a local directory first and then `<run>/profile/` (the trace
  plugin's layout: `plugins/profile/<session>/<host>.xplane.pb`), which xprof or TensorBoard's
  profile plugin opens.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from jobs.runtime import storage

TENSORBOARD_DIR = "tensorboard"
PROFILE_DIR = "profile"


def parse_steps(text: str) -> tuple[int, int]:
    """`A:B` -> (A, B), 1 <= A <= B (pure); ValueError saying the form otherwise."""
    first, sep, last = text.partition(":")
    if not sep or not first.isdigit() or not last.isdigit() or not 1 <= int(first) <= int(last):
        raise ValueError(f"{text!r} is not A:B, two step numbers with 1 <= A <= B, e.g. 10:12")
    return int(first), int(last)


class Board:
    """Scalars into `<run root>/tensorboard/`; a no-op when not `enabled` (ranks other than 0)."""

    def __init__(self, run_root: str, enabled: bool = True, suffix: str = ""):
        self.writer: Any = None
        if enabled:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(storage.join(run_root, TENSORBOARD_DIR), flush_secs=30, filename_suffix=suffix)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            if value is not None:
                self.writer.add_scalar(name, float(value), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()  # flushes
            self.writer = None


class ProfileWindow:
    """Starts JAX's profiler before step A and stops it after step B, then copies the trace into
    `<run root>/profile/`; nothing when `steps` is None."""

    def __init__(self, steps: tuple[int, int] | None, run_root: str, host: int):
        self.steps, self.run_root, self.host = steps, run_root, host
        self.local: str | None = None

    def before(self, step: int) -> None:
        """Call before running step `step` (1-based)."""
        import jax

        if self.steps and step == self.steps[0] and self.local is None:
            self.local = tempfile.mkdtemp(prefix="jobs-profile-")
            jax.profiler.start_trace(self.local)

    def after(self, step: int) -> str | None:
        """Call after step `step` has run; where the trace went once it is written, else None."""
        import jax

        if not self.steps or self.local is None or step < self.steps[1]:
            return None
        jax.profiler.stop_trace()
        target = storage.join(self.run_root, PROFILE_DIR)
        for folder, _, files in os.walk(self.local):
            for name in files:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, self.local)
                with open(path, "rb") as f:
                    storage.write_bytes(storage.join(target, relative), f.read())
        self.local = None
        return target
