"""JAX's persistent compilation cache, shared by every attempt and every run of an environment, so
that a rerun after a lost host (and a RayJob's cold start) reads its step's executable instead of
compiling it again.

Where: `--compilation-cache DIR|gs://...|none`; by default `$JOBS_COMPILATION_CACHE` (the
simulation's `<state dir>/xla-cache`, set by `jobs.local`), else `gs://<bucket>/xla-cache/train` in
the bucket of the run's storage (the environment's bucket, by default): the RayService keeps vLLM's
XLA cache at `<bucket>/xla-cache/<model>` (infra.serving.XLA_CACHE_DIR), one layout for both. A
local `--storage` keeps it in `<storage>/.xla-cache`. On GKE the cache must be shared by the hosts
(gs://): only process 0 writes entries, so a per-pod directory would serve worker 0 alone.

What JAX does with it (jax 0.10.2, jax/_src, read 2026-12-04):
- compiler.py `_cache_write` (lines 788-835): only the process with `process_id == 0` writes an
  entry ("contention for writes on some filesystems, e.g., GCS"); every process reads. Entries of
  computations with host callbacks are never written.
- compiler.py line 814: nothing that compiled in under `jax_persistent_cache_min_compile_time_secs`
  (config.py line 1419: default 1.0 s) is written. A CPU compile on the simulation takes well under
  that, so the simulation (platform cpu) lowers the floor to 0; a TPU keeps JAX's default.
- cache_key.py `get` (lines 75-135): the key hashes the computation, the jaxlib version, the
  backend (platform) version, the XLA flags, the compile options and the devices' accelerator
  config: a different slice shape, `XLA_FLAGS` or jaxlib is a miss, never a wrong hit. So is a
  different `--steps`: the learning-rate schedule that runs to it is part of the step's program.
  A rerun after a lost host, or another run of the same flags, finds it.
- lru_cache.py line 63: a non-local path goes through `etils.epath` (gcsfs here: `jobs.train`'s
  requirements). A `gs://` path that cannot be reached hangs the first compile
  (jax-ml/jax#22364), which is why `check_reachable` runs at parse time, bounded.
- compilation_cache.py `_initialize_cache` (line 239) reads the path once, at the first compile:
  `enable` must run before anything compiles in the worker.
- compiler.py lines 426-443: each lookup records the monitoring events counted by `CacheEvents`.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import uuid
from typing import Any

from jobs.runtime import storage
from jobs.runtime.deadlines import call_with_timeout

CACHE_ENV = "JOBS_COMPILATION_CACHE"
XLA_CACHE_DIR = "xla-cache"  # = infra.serving.XLA_CACHE_DIR (tests/jobs/runtime check they agree)
TRAIN_CACHE = "train"  # <bucket>/xla-cache/train, beside the RayService's <bucket>/xla-cache/<model>
DISABLED = "none"
PROBE_TIMEOUT_S = 20.0
JAX_DEFAULT_MIN_COMPILE_S = 1.0  # jax_persistent_cache_min_compile_time_secs' default

HIT = "/jax/compilation_cache/cache_hits"
MISS = "/jax/compilation_cache/cache_misses"


class CacheError(OSError):
    """A compilation cache path this job cannot use; the message names it and says why."""


def default_cache(storage_path: str) -> str:
    """The cache a run uses without `--compilation-cache` (pure but for the env): the run storage's
    bucket's `xla-cache/train` (with the environment's default storage, its bucket), a `.xla-cache`
    directory in a local storage."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    if storage_path.startswith("gs://"):
        bucket = storage_path[len("gs://") :].split("/", 1)[0]
        return f"gs://{bucket}/{XLA_CACHE_DIR}/{TRAIN_CACHE}"
    return storage.join(storage_path, f".{XLA_CACHE_DIR}")


def resolve(flag: str | None, storage_path: str) -> str:
    """`--compilation-cache` as the run uses it: "" for none, a local path made absolute."""
    uri = default_cache(storage_path) if flag is None else flag
    if uri in ("", DISABLED):
        return ""
    return uri if storage.is_remote(uri) else storage.join(uri)


def check_reachable(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Write, read back and delete a small probe under `uri`, within `timeout_s`; CacheError says
    why not (a path that cannot be created, a bucket that is not there or not ours, no answer)."""
    probe = storage.join(uri, f".probe-{socket.gethostname()}-{uuid.uuid4().hex[:8]}")

    def round_trip() -> None:
        storage.write_bytes(probe, b"ok")
        if storage.read_bytes(probe) != b"ok":
            raise storage.StorageError(f"{probe} read back differently")
        fs, path = storage.filesystem(probe)
        fs.delete_file(path)

    try:
        call_with_timeout(round_trip, timeout_s, f"a probe write to {uri}")
    except TimeoutError:
        raise CacheError(f"{uri} did not answer within {timeout_s:.0f} s (JAX would hang on its first compile)") from None
    except OSError as err:
        raise CacheError(f"{uri} cannot be written ({_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def min_compile_s(platform: str) -> float:
    """The shortest compile worth writing: JAX's default on TPU; 0 on the CPU simulation, whose
    compiles all take less than the default (pure)."""
    return 0.0 if platform == "cpu" else JAX_DEFAULT_MIN_COMPILE_S


def enable(uri: str) -> None:
    """Point this process's JAX at the cache (before its first compile); "" leaves it off."""
    if not uri:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", uri)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_s(jax.devices()[0].platform))


class CacheEvents:
    """Counts this process's persistent-cache hits and misses from JAX's own monitoring events, in
    all and per thread: JAX records them in the thread that compiles (compiler.py lines 426-443),
    so a compile on a thread of its own is counted apart from a restore's compiles beside it."""

    def __init__(self) -> None:
        import jax.monitoring

        self._by_thread: collections.Counter[tuple[int, str]] = collections.Counter()
        jax.monitoring.register_event_listener(self._on_event)

    def _on_event(self, event: str, **_: Any) -> None:
        if event in (HIT, MISS):
            self._by_thread[(threading.get_ident(), event)] += 1

    @property
    def hits(self) -> int:
        return sum(n for (_, event), n in self._by_thread.items() if event == HIT)

    @property
    def misses(self) -> int:
        return sum(n for (_, event), n in self._by_thread.items() if event == MISS)

    def of_thread(self, ident: int | None = None) -> tuple[int, int]:
        """(hits, misses) so far in thread `ident` (default: this one)."""
        ident = threading.get_ident() if ident is None else ident
        return self._by_thread[(ident, HIT)], self._by_thread[(ident, MISS)]

    def close(self) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_listener(self._on_event)
