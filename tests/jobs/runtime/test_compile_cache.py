"""The persistent compilation cache's path rules (jobs.runtime.compile_cache) and `jobs.train`'s
refusal, at parse time and in one line, of a cache it cannot reach (jax-ml/jax#22364: JAX would
hang on its first compile instead)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infra import serving
from jobs import REPO_ROOT
from jobs.runtime import compile_cache


def test_one_layout_with_the_rayservices_xla_cache(monkeypatch):
    monkeypatch.delenv(compile_cache.CACHE_ENV, raising=False)
    assert compile_cache.XLA_CACHE_DIR == serving.XLA_CACHE_DIR  # <bucket>/xla-cache/<model> for vLLM
    runs = "gs://acme-dev/ray-train"  # jobs.train's default storage in an environment's bucket
    assert compile_cache.resolve(None, runs) == "gs://acme-dev/xla-cache/train"
    assert compile_cache.resolve(None, "/data/runs") == "/data/runs/.xla-cache"
    assert compile_cache.resolve("none", runs) == ""
    monkeypatch.setenv(compile_cache.CACHE_ENV, "/sim/xla-cache")  # what jobs.local sets
    assert compile_cache.resolve(None, runs) == "/sim/xla-cache"
    assert compile_cache.resolve("gs://other/cache", runs) == "gs://other/cache"


def test_the_cpu_simulation_caches_every_compile_and_a_tpu_keeps_jaxs_floor():
    assert compile_cache.min_compile_s("cpu") == 0.0
    assert compile_cache.min_compile_s("tpu") == compile_cache.JAX_DEFAULT_MIN_COMPILE_S == 1.0


def train_parse(*flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = "import sys; from jobs.train import parse_config; parse_config(sys.argv[1:]); print('parsed')"
    argv = ["--generation", "v6e", "--topology", "4x4", "--storage", "/tmp/unused", *flags]
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)


def one_line_error(out: subprocess.CompletedProcess, *says: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "argument --compilation-cache" in last and all(s in last for s in says), last


def test_a_cache_path_that_cannot_be_created_is_one_line_at_parse_time(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    one_line_error(train_parse("--compilation-cache", str(blocker / "cache")), str(blocker / "cache"))


def test_an_unreachable_gs_cache_is_refused_within_the_probes_bound(tmp_path):
    """The probe's bound, at 2 s (jobs.train's parse waits PROBE_TIMEOUT_S, below in make test-slow)."""
    import os

    from jobs.runtime.net import free_port

    code = (
        "import sys; from jobs.runtime.compile_cache import CacheError, check_reachable\n"
        "try:\n    check_reachable(sys.argv[1], timeout_s=2.0)\nexcept CacheError as err:\n    print(err)\n"
    )
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    proc = subprocess.run(
        [sys.executable, "-c", code, "gs://no-such-bucket/xla-cache/train"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert (
        proc.returncode == 0
        and proc.stdout.strip() == "gs://no-such-bucket/xla-cache/train did not answer within 2 s (JAX would hang on its first compile)"
    ), proc.stdout + proc.stderr


@pytest.mark.slow  # keeps make test under 12 minutes on 2 cores; make test-slow runs it
def test_an_unreachable_gs_cache_is_one_line_at_parse_time_not_a_hang(tmp_path):
    import os

    from jobs.runtime.net import free_port

    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    one_line_error(train_parse("--compilation-cache", "gs://no-such-bucket/xla-cache/train", env=env), "gs://no-such-bucket")


def test_a_reachable_cache_parses(tmp_path):
    out = train_parse("--compilation-cache", str(tmp_path / "cache"))
    assert out.returncode == 0 and "parsed" in out.stdout, out.stderr
    assert not list((tmp_path / "cache").iterdir())  # the probe cleaned up after itself


COUNT_BY_THREAD = """
import sys, threading
import jax, jax.numpy as jnp
from jobs.runtime import compile_cache

compile_cache.enable(sys.argv[1])
events = compile_cache.CacheEvents()
x = jax.ShapeDtypeStruct((8,), jnp.float32)  # shapes alone: nothing else compiles
jax.jit(lambda v: v * 2).lower(x).compile()  # the step: written in the first process, read in the second
other = {}
def beside():  # a new program each time, on a thread of its own (a restore's compiles)
    jax.jit(lambda v: v + float(sys.argv[2])).lower(x).compile()
    other["counts"] = events.of_thread()
t = threading.Thread(target=beside); t.start(); t.join()
print(events.of_thread(), other["counts"], (events.hits, events.misses))
"""


def test_cache_hits_are_counted_per_thread_from_jax_s_own_events(tmp_path):
    # Two processes share a cache: the second finds the first's program on its main thread, while
    # a thread beside it compiles a new one; each thread's counts are its own.
    def run(seed: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", COUNT_BY_THREAD, str(tmp_path / "cache"), seed],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip()

    assert run("1") == "(0, 1) (0, 1) (0, 2)"
    assert run("2") == "(1, 0) (0, 1) (1, 1)"
