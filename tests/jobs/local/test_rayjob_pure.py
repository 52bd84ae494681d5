"""`python -m jobs.local rayjob` before anything starts: what it reads from a RayJob, the one-line
errors (exit 2, naming the field) for a file it cannot run, the refusal while a cluster is up, the
`.status` objects it writes (valid against KubeRay's CRD), and `--state-dir` before or after the
subcommand (no cluster)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from infra import catalog
from jobs.local import DEFAULT_STATE_DIR, LocalCluster, LocalNode
from jobs.local.__main__ import _parser, main
from jobs.local.rayjob_spec import RayJobStatus, parse_rayjob
from tests import kuberay_schema
from tests.jobs.local.rayjobs import CRDS, KUBERAY_TPU_SAMPLE, NETWORK_POLICY, rayjob, to_yaml, worker_group, write

G = "spec.rayClusterSpec.workerGroupSpecs[0]"


@pytest.fixture
def short_dir():
    # Short on purpose: Ray's unix socket paths under a state dir must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="rjp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_printed_rayjob_is_read_with_its_tpu_slice():
    doc = rayjob(
        "healthcheck-1a2b3c4d",
        "python -m jobs.healthcheck --env dev --generation v6e --topology 4x4",
        topology="4x4",
        hosts=4,
        runtimeEnvYAML="env_vars: {SOME: value}\n",
        activeDeadlineSeconds=7200,
        preRunningDeadlineSeconds=1800,
    )
    spec = parse_rayjob(to_yaml(NETWORK_POLICY, doc), "rayjob.yaml")
    assert spec.name == "healthcheck-1a2b3c4d"
    assert spec.entrypoint.startswith("python -m jobs.healthcheck --env dev")
    assert spec.runtime_env == {"env_vars": {"SOME": "value"}}
    assert (spec.active_deadline_s, spec.pre_running_deadline_s, spec.shutdown_after_finishes) == (7200, 1800, True)
    assert spec.shape == catalog.shape("v6e", "4x4") and spec.slices == 1 and spec.group_name == "v6e-4x4"


@pytest.mark.skipif(not KUBERAY_TPU_SAMPLE.is_file(), reason="../shared/kuberay/samples is not here")
def test_kuberays_own_tpu_rayjob_sample_is_read():
    spec = parse_rayjob(KUBERAY_TPU_SAMPLE.read_text(), KUBERAY_TPU_SAMPLE.name)
    assert spec.shape == catalog.shape("v6e", "4x4") and spec.shape.hosts == 4 and spec.slices == 1
    assert spec.runtime_env["pip"][0].startswith("jax[tpu]")
    assert spec.active_deadline_s is None and not spec.shutdown_after_finishes  # KubeRay's defaults


def _drop(path: str):
    def edit(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        del node[last]

    return edit


def _set(path: str, value):
    def edit(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def _cpu_group(doc: dict) -> None:
    pod = worker_group(doc)["template"]["spec"]
    pod["nodeSelector"] = {}
    pod["containers"][0]["resources"] = {"requests": {"cpu": "4"}}


def _two_tpu_groups(doc: dict) -> None:
    groups = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    groups.append({**groups[0], "groupName": "second"})


SELECTOR = f"{G}.template.spec.nodeSelector"
BAD = {
    "no RayJob": (None, "kind: {path} holds 0 RayJob documents (found: NetworkPolicy); give exactly one"),
    "another apiVersion": (_set("apiVersion", "ray.io/v1alpha1"), "apiVersion: 'ray.io/v1alpha1', but this runs ray.io/v1 RayJobs"),
    "no name": (_drop("metadata.name"), "metadata.name: missing"),
    "no entrypoint": (_drop("spec.entrypoint"), "spec.entrypoint: missing"),
    "runtime env not a mapping": (_set("spec.runtimeEnvYAML", "- pip\n"), "spec.runtimeEnvYAML: list, but a runtime env is a mapping"),
    "zero deadline": (_set("spec.activeDeadlineSeconds", 0), "spec.activeDeadlineSeconds: 0; KubeRay takes a positive number"),
    "deadline as text": (_set("spec.preRunningDeadlineSeconds", "600"), "spec.preRunningDeadlineSeconds: '600' is not a int"),
    "interactive mode": (_set("spec.submissionMode", "InteractiveMode"), "spec.submissionMode: InteractiveMode waits"),
    "no TPU group": (_cpu_group, "spec.rayClusterSpec.workerGroupSpecs: 0 TPU worker groups (none requests google.com/tpu)"),
    "two TPU groups": (_two_tpu_groups, "spec.rayClusterSpec.workerGroupSpecs: 2 TPU worker groups ([0] v6e-2x2, [1] second)"),
    "unknown accelerator": (
        lambda d: worker_group(d)["template"]["spec"]["nodeSelector"].update({"cloud.google.com/gke-tpu-accelerator": "tpu-v9-slice"}),
        f"{SELECTOR}[\"cloud.google.com/gke-tpu-accelerator\"]: 'tpu-v9-slice' is not a TPU the catalog knows; valid: tpu7x, tpu-v6e-slice",
    ),
    "no topology": (
        lambda d: worker_group(d)["template"]["spec"]["nodeSelector"].pop("cloud.google.com/gke-tpu-topology"),
        f'{SELECTOR}["cloud.google.com/gke-tpu-topology"]: missing',
    ),
    "unknown topology": (
        lambda d: worker_group(d)["template"]["spec"]["nodeSelector"].update({"cloud.google.com/gke-tpu-topology": "3x3"}),
        f"{SELECTOR}[\"cloud.google.com/gke-tpu-topology\"]: '3x3' is not offered for v6e; valid: 1x1, 2x2",
    ),
    "chips the shape cannot have": (
        lambda d: worker_group(d)["template"]["spec"]["containers"][0]["resources"]["requests"].update({"google.com/tpu": "8"}),
        f'{G}.template.spec.containers[0].resources.requests["google.com/tpu"]: v6e 2x2 cannot be built from 8-chip hosts',
    ),
    "hosts disagree with the shape": (
        lambda d: worker_group(d).update({"numOfHosts": 2}),
        f"{G}.numOfHosts: 2, but a v6e 2x2 slice has 1 hosts",
    ),
    "no replicas": (lambda d: worker_group(d).pop("replicas"), f"{G}.replicas: 0; the number of slices must be at least 1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_file_it_cannot_run_is_one_line_naming_the_field_and_starts_nothing(case, tmp_path, capsys):
    edit, expected = BAD[case]
    doc = rayjob()
    if edit:
        edit(doc)
    path = tmp_path / "rayjob.yaml"
    path.write_text(to_yaml(NETWORK_POLICY, *([doc] if edit else [])))
    state_dir = tmp_path / "state"
    assert main(["--state-dir", str(state_dir), "rayjob", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {expected.format(path=path)}") and err.count("\n") == 1, err
    assert out == "" and not state_dir.exists()


def test_the_example_message_for_a_4x4_slice(tmp_path, capsys):
    doc = rayjob(topology="4x4", hosts=2)
    assert main(["--state-dir", str(tmp_path / "s"), "rayjob", str(write(tmp_path / "j.yaml", doc))]) == 2
    assert capsys.readouterr().err == f"error: {G}.numOfHosts: 2, but a v6e 4x4 slice has 4 hosts\n"


def test_stdin_a_missing_file_and_a_file_that_is_not_yaml(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("kind: [unclosed\n"))
    assert main(["--state-dir", str(tmp_path / "s"), "rayjob", "-"]) == 2
    assert capsys.readouterr().err.startswith("error: stdin: not YAML (")
    assert main(["--state-dir", str(tmp_path / "s"), "rayjob", str(tmp_path / "nothing.yaml")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nothing.yaml'}: No such file or directory\n"


def test_an_unwritable_status_file_is_a_bad_flag(tmp_path, short_dir, capsys):
    path = write(tmp_path / "j.yaml", rayjob())
    with pytest.raises(SystemExit) as exited:
        main(["--state-dir", str(short_dir / "s"), "rayjob", str(path), "--status-file", str(tmp_path / "no" / "such" / "dir")])
    assert exited.value.code == 2
    assert "argument --status-file: cannot write" in capsys.readouterr().err
    assert not (short_dir / "s").exists()


def test_a_second_cluster_in_the_same_state_dir_is_refused_before_anything_starts(tmp_path, short_dir, capsys):
    state_dir = short_dir
    # A cluster "running" from this state dir: its head's pid is this (live) process.
    LocalCluster(
        str(state_dir), str(state_dir / "ray"), "127.0.0.1:1", "http://127.0.0.1:2", "v6e", "2x2", 4, 1,
        (LocalNode("head", None, None, os.getpid(), "head.log"),),
    ).save()  # fmt: skip
    status_file = tmp_path / "status.jsonl"
    code = main(["--state-dir", str(state_dir), "rayjob", str(write(tmp_path / "j.yaml", rayjob())), "--status-file", str(status_file)])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and status_file.read_text() == ""
    assert err.startswith(f"[local] error: a local cluster is already running from {state_dir}") and err.count("\n") == 1


@pytest.mark.parametrize("before", [True, False])
@pytest.mark.parametrize("command", ["status", "down"])
def test_the_state_dir_flag_works_before_and_after_the_subcommand(before, command, tmp_path, capsys):
    argv = ["--state-dir", str(tmp_path), command] if before else [command, "--state-dir", str(tmp_path)]
    main(argv)
    assert f"in {tmp_path}" in capsys.readouterr().out  # "no local cluster in X", "nothing running in X"


def test_the_state_dir_defaults_to_the_repos_build_dir_for_every_subcommand():
    parser = _parser()  # parsed only: never run `down` on a developer's own cluster
    for command in ("up", "status", "down", "env", "rayjob -"):
        assert parser.parse_args(command.split()).state_dir == str(DEFAULT_STATE_DIR)
        assert parser.parse_args(["--state-dir", "/x", *command.split()]).state_dir == "/x"


def _statuses() -> list[dict]:
    """The `.status` objects of one run, as `jobs.local.rayjob` fills them in."""
    s = RayJobStatus.initializing("hc")
    out = [s.to_json()]
    s.job_deployment_status, s.dashboard_url = "Running", "127.0.0.1:8265"
    out.append(s.to_json())
    s.job_status, s.message, s.job_start_ms = "RUNNING", "Job is currently running.", 1_780_000_000_000
    out.append(s.to_json())
    for final in ("SUCCEEDED", "FAILED", "STOPPED"):
        done = RayJobStatus(**vars(s))
        done.job_status, done.job_end_ms = final, 1_780_000_060_000
        done.finish(*(("Failed", "AppFailed", "Job failed") if final == "FAILED" else ("Complete",)))
        out.append(done.to_json())
    deadline = RayJobStatus(**vars(s))
    deadline.finish("Failed", "DeadlineExceeded", "The RayJob has passed the activeDeadlineSeconds. ...")
    return [*out, deadline.to_json()]


@pytest.mark.skipif(not CRDS.is_dir(), reason="../shared/kuberay/crds is not here")
def test_every_status_it_writes_is_valid_against_the_rayjob_crd():
    for status in _statuses():
        manifest = {**rayjob(), "status": status}
        assert kuberay_schema.errors(CRDS, manifest) == [], json.dumps(status)


def test_the_status_is_kuberays_shape():
    first, running, *_, succeeded, failed, stopped, deadline = _statuses()
    assert set(first) == {
        "jobDeploymentStatus",
        "jobId",
        "rayClusterName",
        "startTime",
    }  # empty fields are left out, as KubeRay's omitempty does
    assert first["jobId"].startswith("hc-") and len(first["jobId"]) == len("hc-") + 5 and first["rayClusterName"] != first["jobId"]
    assert running["dashboardURL"] == "127.0.0.1:8265"
    assert (succeeded["jobDeploymentStatus"], succeeded["succeeded"], succeeded["failed"]) == ("Complete", 1, 0)
    assert (failed["jobDeploymentStatus"], failed["reason"], failed["failed"]) == ("Failed", "AppFailed", 1)
    assert (stopped["jobDeploymentStatus"], stopped["succeeded"], stopped["failed"]) == (
        "Complete",
        0,
        0,
    )  # as KubeRay: a stopped job completes
    assert deadline["reason"] == "DeadlineExceeded" and deadline["jobStatus"] == "RUNNING"
    assert succeeded["rayJobInfo"] == {"startTime": "2026-05-28T20:26:40Z", "endTime": "2026-05-28T20:27:40Z"}
