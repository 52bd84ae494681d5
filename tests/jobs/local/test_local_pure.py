"""What a simulated host is told, the state file, and the demo's result parsing (no cluster)."""

from __future__ import annotations

import dataclasses

from infra import catalog
from jobs import cli, demo, local
from jobs.local.env import clean_base_env, write_token


def test_a_simulated_host_gets_what_the_gke_webhook_injects_plus_cpu_jax():
    shape = catalog.shape("v6e", "4x4")
    env = local.host_env(shape, local.slice_name(shape, 1), 3)
    assert env == {
        "TPU_NAME": "sim-v6e-16-1",
        "TPU_WORKER_ID": "3",
        "TPU_ACCELERATOR_TYPE": "v6e-16",
        "TPU_TOPOLOGY": "4x4",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
    }
    # TPU7x shows each of a chip's two TensorCores as a JAX device.
    tpu7x = catalog.shape("tpu7x", "2x2x2")
    assert local.host_env(tpu7x, "x", 0)["XLA_FLAGS"].endswith("=8")
    assert local.host_env(tpu7x, "x", 0)["TPU_ACCELERATOR_TYPE"] == tpu7x.pod_type == "v7x-16"


def test_ray_files_and_the_token_stay_under_the_state_dir():
    env = local.ray_env("/repo/build/local-ray")
    assert env["RAY_TMPDIR"] == "/repo/build/local-ray/ray"
    # Token authentication on, as on GKE; the token is read from the state dir, never ~/.ray.
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/repo/build/local-ray/auth_token"
    assert "RAY_AUTH_TOKEN" not in env
    assert local.DEFAULT_STATE_DIR.parts[-2:] == ("build", "local-ray")


def test_a_new_token_per_cluster_readable_by_its_owner_only(tmp_path):
    (tmp_path / "auth_token").write_text("an old token")
    (tmp_path / "auth_token").chmod(0o644)
    first = write_token(tmp_path).read_text()
    assert (tmp_path / "auth_token").stat().st_mode & 0o777 == 0o600
    assert first != "an old token" and len(first) >= 32
    assert write_token(tmp_path).read_text() != first


def test_the_printed_exports_name_the_token_file_not_the_token(tmp_path):
    token = write_token(tmp_path).read_text()
    lines = local.client_exports(tmp_path, "http://127.0.0.1:8265").splitlines()
    assert lines == [
        "export RAY_ADDRESS=http://127.0.0.1:8265",
        "export RAY_AUTH_MODE=token",
        f"export RAY_AUTH_TOKEN_PATH={tmp_path}/auth_token",
    ]
    assert token not in "\n".join(lines)


def test_a_developers_ray_token_never_reaches_the_simulated_nodes(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a GKE token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/elsewhere")
    assert not any(k.startswith("RAY_AUTH_") for k in clean_base_env())


def test_state_round_trips(tmp_path):
    cluster = local.LocalCluster(
        state_dir=str(tmp_path),
        ray_temp_dir=str(tmp_path / "ray"),
        gcs_address="127.0.0.1:1",
        dashboard_url="http://127.0.0.1:2",
        generation="v6e",
        topology="4x4",
        chips_per_host=4,
        slices=2,
        nodes=(local.LocalNode("head", None, None, 10, "h.log"), local.LocalNode("host", "s", 0, 11, "s.log")),
    )
    cluster.save()
    assert local.LocalCluster.load(tmp_path) == cluster
    assert cluster.shape == catalog.shape("v6e", "4x4")
    assert cluster.storage_path == str(tmp_path / "checkpoints")
    assert local.LocalCluster.load(tmp_path / "nothing") is None
    assert local.status(tmp_path / "nothing") is None and local.down(tmp_path / "nothing") is None


def test_the_demo_reads_the_last_result_line():
    logs = 'x\nHEALTHCHECK {"ok": false}\nnoise\nHEALTHCHECK {"ok": true, "devices": 16}\nHEALTHCHECK {broken\n'
    assert cli.parse_result(logs, "HEALTHCHECK") == {"ok": True, "devices": 16}
    assert cli.parse_result("nothing", "TRAIN") is None
    outcome = demo.JobOutcome("hc", "id", "SUCCEEDED", 1.0, {"ok": False})
    assert not outcome.ok and dataclasses.replace(outcome, result={"ok": True}).ok
    assert not dataclasses.replace(outcome, status="FAILED", result={"ok": True}).ok
