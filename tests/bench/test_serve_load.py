"""The serve bench's load is vLLM's own benchmark client, and a server that returns fewer tokens than
asked fails it.

A small OpenAI-compatible server (real HTTP, in a thread of this test) streams completions the way
vLLM does (text chunks, then a `usage` chunk, then [DONE]). `bench/serve_load.py`, the bench's own
load function, runs in `.venv-serve` and drives it with vLLM's client (`vllm bench serve` through
bench/vllm_cli.py). The server records every request, so the tests can see that the load came
from vLLM's client (its payload: `ignore_eos`, `stream_options.include_usage`, the random
dataset's prompts) and not from anything of ours. About 10 s per client run on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
MODEL = "fake-model"
OUTPUT_LEN = 8
PROBE_PROMPT = "usage probe"  # what bench/serve_load.py's probe_usage sends

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not (REPO / ".venv-serve" / ".installed").is_file(),
        reason=".venv-serve is not installed: run scripts/setup_serve_env.sh (`make setup` does)",
    ),
]


class FakeOpenAI(ThreadingHTTPServer):
    """Streams `max_tokens - short` tokens per completion and reports that many in `usage`
    (`spare_probe`: except to the bench's usage probe, so that only the client's counts catch it)."""

    daemon_threads = True

    def __init__(self, short: int = 0, usage: bool = True, spare_probe: bool = False):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.short, self.usage, self.spare_probe = short, usage, spare_probe
        self.requests: list[dict] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeOpenAI
    protocol_version = "HTTP/1.0"  # one response per connection, ended by closing it

    def log_message(self, format, *args):  # quiet
        pass

    def do_GET(self):
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/v1/completions":  # /tokenize: the client then skips its prompt alignment
            self._json(404, {"error": "not found"})
            return
        self.server.requests.append(body)
        probe = body.get("prompt") == PROBE_PROMPT
        n = max(0, int(body.get("max_tokens", 16)) - (0 if probe and self.server.spare_probe else self.server.short))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            self._event(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
                }
            )
        if self.server.usage:
            self._event(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": MODEL,
                    "choices": [],
                    "usage": {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n},
                }
            )
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, data: dict) -> None:
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _json(self, status: int, data: dict) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    """The random tiny model's directory (its tokenizer is what the random dataset decodes with)."""
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    subprocess.run([str(SERVE_PYTHON), "-m", "jobs.serve.tiny_model", str(out)], cwd=REPO, check=True, timeout=120, capture_output=True)
    return out


@contextlib.contextmanager
def fake_server(**kw) -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(**kw)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run_load(server: FakeOpenAI, tokenizer: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    cmd = [str(SERVE_PYTHON), "bench/serve_load.py", "--base-url", server.url, "--model", MODEL, "--tokenizer", str(tokenizer)]
    cmd += ["--concurrency", "2", "--num-prompts", "4", "--input-len", "16", "--output-len", str(OUTPUT_LEN)]
    cmd += ["--result", str(tmp_path / "result.json"), "--timeout", "120"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow  # keeps make test under 12 minutes on 2 cores; make test-slow runs it
def test_the_load_comes_from_vllms_client_and_counts_the_servers_usage(tokenizer, tmp_path):
    with fake_server() as server:
        proc = run_load(server, tokenizer, tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = json.loads(proc.stdout)
        # Besides the usage probe: 2 warm-ups (one per slot of concurrency) and the 4 measured requests.
        completions = [r for r in server.requests if r.get("prompt") != PROBE_PROMPT]
        assert len(completions) == 2 + 4
        for body in completions:
            # vLLM's client payload (vllm/benchmarks/lib/endpoint_request_func.py, openai backend).
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
            assert body["ignore_eos"] is True and body["max_tokens"] == OUTPUT_LEN and body["model"] == MODEL
            assert body["repetition_penalty"] == 1.0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == 4 and result["output_lens"] == [OUTPUT_LEN] * 4
    assert metrics["output_throughput"] > 0 and metrics["load"]["concurrency"] == 2


def test_a_server_that_returns_fewer_tokens_than_asked_fails_the_load(tokenizer, tmp_path):
    with fake_server(short=3) as server:
        proc = run_load(server, tokenizer, tmp_path)
    assert proc.returncode == 1
    assert f"generated {OUTPUT_LEN - 3} tokens when asked for {OUTPUT_LEN}" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # keeps make test under 12 minutes on 2 cores; make test-slow runs it
def test_short_requests_fail_the_load_even_past_the_probe(tokenizer, tmp_path):
    """A server that answers the probe in full but the load's requests short is caught in the
    client's own per-request counts."""
    with fake_server(short=2, spare_probe=True) as server:
        proc = run_load(server, tokenizer, tmp_path)
    assert proc.returncode == 1
    assert "returned fewer tokens than asked at concurrency 2" in proc.stderr
    assert f"{4 * (OUTPUT_LEN - 2)} tokens for 4 requests of {OUTPUT_LEN}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_server_without_usage_fails_rather_than_being_re_tokenized(tokenizer, tmp_path):
    with fake_server(usage=False) as server:
        proc = run_load(server, tokenizer, tmp_path)
    assert proc.returncode == 1
    assert "does not report usage" in proc.stderr
