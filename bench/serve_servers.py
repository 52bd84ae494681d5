"""The two servers of the serve bench, each a process group of its own that is always torn down:

- `vllm serve MODEL_DIR` (vLLM's own OpenAI server, through bench/vllm_cli.py) with the engine flags
  of our LLMConfig (`engine_flags`: infra.serving.cpu_llm_config_kwargs's engine_kwargs as flags);
- Ray Serve LLM: this file run as `python bench/serve_servers.py ray PORT MODEL_DIR ENV_JSON`, a
  child that runs jobs.serve.local.local_serve with the given Ray environment and serves until its
  stdin closes.

Each start waits (bounded) until /v1/models lists the model; a server that exits or does not answer
in time is an error naming it, with the last lines of its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra.serving import cpu_llm_config_kwargs  # noqa: E402
from jobs.runtime.net import free_port  # noqa: E402
from jobs.serve.local import MAX_MODEL_LEN, MODEL_ID  # noqa: E402

VLLM_CLI = Path(__file__).resolve().parent / "vllm_cli.py"
# Ray's own defaults for what jobs.serve.local.local_ray_env changes (`--variant ray-defaults`):
# ray/serve/_private/constants.py and ray/llm/_internal/serve/constants.py (2.60.0), and
# `worker_niceness` in src/ray/common/ray_config_def.h.
RAY_DEFAULTS = {
    "RAY_SERVE_ENABLE_HA_PROXY": "0",
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "0",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
    "RAY_worker_niceness": "15",
}


class BenchError(RuntimeError):
    """A server that did not come up, or a run that could not be measured."""


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log: Path
    start_s: float = 0.0

    @property
    def slug(self) -> str:
        return slug(self.name)


def slug(name: str) -> str:
    """A file name for a server's logs and results: `Ray Serve LLM` -> ray-serve-llm."""
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower())


def engine_flags(engine_kwargs: Mapping[str, Any]) -> list[str]:
    """LLMConfig engine_kwargs as `vllm serve` flags: max_model_len=512 -> --max-model-len 512,
    enforce_eager=True -> --enforce-eager (False -> --no-enforce-eager)."""
    flags: list[str] = []
    for key, value in engine_kwargs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def our_engine_kwargs(model_dir: Path) -> dict[str, Any]:
    """What jobs.serve.build_app gives Ray Serve LLM for a local model (the same function)."""
    return cpu_llm_config_kwargs(model_dir, model_id=MODEL_ID, max_model_len=MAX_MODEL_LEN)["engine_kwargs"]


def _log_tail(log: Path, n: int = 8) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return "(no log)"


def wait_ready(server: Server, timeout_s: float) -> None:
    """Poll GET /v1/models until it lists MODEL_ID; raise BenchError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.proc.poll() is not None:
            raise BenchError(
                f"{server.name} exited with status {server.proc.returncode} before serving; its log ({server.log}): {_log_tail(server.log)}"
            )
        try:
            with urllib.request.urlopen(f"{server.url}/v1/models", timeout=5) as resp:
                if MODEL_ID in {m.get("id") for m in json.load(resp).get("data", [])}:
                    return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise BenchError(
                f"{server.name} did not list {MODEL_ID} at {server.url}/v1/models within {timeout_s:.0f} s; its log ({server.log}): {_log_tail(server.log)}"
            )
        time.sleep(1)


def stop(server: Server, graceful_s: float) -> None:
    """Close stdin (the Ray child's signal to tear down), then SIGTERM, then SIGKILL the whole group."""
    proc = server.proc
    if proc.stdin and not proc.stdin.closed:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    for sig, wait_s in ((None, graceful_s), (signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # What the leader left behind: Ray puts its workers in process groups of their own (and HAProxy
    # in its manager's), but all stay in the session the server started.
    for pid in session_pids(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _serving(name: str, cmd: list[str], port: int, log_dir: Path, timeout_s: float, graceful_s: float) -> Iterator[Server]:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{slug(name)}.log"
    out: IO[bytes] = log.open("wb")
    t = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(name, f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_ready(server, timeout_s)
        server.start_s = time.monotonic() - t
        yield server
    finally:
        stop(server, graceful_s)
        out.close()


def start_vllm(model_dir: Path, log_dir: Path, timeout_s: float):
    port = free_port()
    cmd = [sys.executable, str(VLLM_CLI), "serve", str(model_dir), "--served-model-name", MODEL_ID]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *engine_flags(our_engine_kwargs(model_dir))]
    return _serving("vllm serve", cmd, port, log_dir, timeout_s, graceful_s=30)


def start_ray(model_dir: Path, log_dir: Path, timeout_s: float, name: str, ray_env: Mapping[str, str]):
    # Several local Rays may run at once (--variant): each HAProxy gets ports of its own.
    env = {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()), **ray_env}
    port = free_port()
    cmd = [sys.executable, __file__, "ray", str(port), str(model_dir), json.dumps(env), str(timeout_s)]
    return _serving(name, cmd, port, log_dir, timeout_s, graceful_s=90)


def session_stats(sid: int) -> Iterator[tuple[int, list[str]]]:
    """(pid, /proc/pid/stat fields after the name) of every process in session `sid`: a server's
    whole tree (Ray's daemons, workers, HAProxy, the engines) stays in the session its leader started."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # the session id; zombies are gone already
            yield int(name), fields


def session_pids(sid: int) -> list[int]:
    return [pid for pid, _ in session_stats(sid)]


def session_cpu_seconds(sid: int) -> float:
    """CPU seconds so far of every process in session `sid`."""
    return sum(cpu_seconds(f) for _, f in session_stats(sid))


def cpu_seconds(fields: list[str]) -> float:
    """A process's CPU seconds so far from its /proc/pid/stat fields after the name (utime + stime)."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(server: Server, seconds: float = 3.0) -> float:
    """What the server costs the machine while it serves nothing, in % of one core."""
    a = session_cpu_seconds(server.proc.pid)
    time.sleep(seconds)
    return 100 * (session_cpu_seconds(server.proc.pid) - a) / seconds


def ray_child(port: int, model_dir: Path, ray_env: dict[str, str], timeout_s: float) -> int:
    from jobs.serve.local import apply_offline_environment, local_serve

    apply_offline_environment()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # local_serve's teardown still runs
    with local_serve(model_dir, port=port, deploy_timeout_s=timeout_s, ray_env=ray_env) as url:
        print(f"serving at {url}", flush=True)
        sys.stdin.readline()  # until the bench closes our stdin
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] != "ray":
        sys.exit("usage: serve_servers.py ray PORT MODEL_DIR ENV_JSON TIMEOUT_S (the serve bench starts it)")
    sys.exit(ray_child(int(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4]), float(sys.argv[5])))
