"""`python -m jobs.submit JOB --env ENV --rayjob`: apply the job's RayJob and its NetworkPolicy,
follow the RayJob through Kueue and KubeRay to its end, and exit with the job's status.

- Apply: `kubectl apply --server-side=false -f -` with the printed documents; kubectl asks the API
  server for strict field validation (its default since 1.27), so a field the CRD does not know is
  refused, not silently pruned. A refusal is one line, exit 2, and whatever was applied before the
  refusal (the NetworkPolicy) is deleted again.
- Follow: `kubectl get rayjob NAME -o json` every POLL_S, one line per phase change
  (jobs.client.rayjob_status): queued (with Kueue's reason, from the RayJob's Workload), admitted,
  Initializing, Running, then Complete / Failed / ValidationFailed. While it runs, the job's logs:
  `kubectl logs -f` of the submitter's pod (K8sJobMode: the pod of the Job KubeRay names after the
  RayJob, whose `ray-job-submitter` container follows the job's logs; a retried pod is followed in
  its turn).
- Exit: 0 the Ray job SUCCEEDED; 1 it failed, was stopped, passed a deadline or was refused by
  KubeRay (the line says why); 2 it could not be applied or followed; 3 `timeout_s` ran out (the
  RayJob and its NetworkPolicy are deleted; the line says what it was waiting for); 130 Ctrl-C or
  SIGTERM (deleted too). After the end nothing is deleted here: the RayJob's cluster goes with
  `ttlSecondsAfterFinished`, and its pods keep their NetworkPolicy until then, since right after
  the apply the policy is made the RayJob's dependent (an ownerReference): Kubernetes' garbage
  collector deletes it with the RayJob, never before. (`--print-rayjob | kubectl apply` cannot
  know the RayJob's uid beforehand: delete its `<name>-ingress` policy with it.)

Every kubectl call is bounded and named in its error, and so is every wait.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

from infra.config import Environment
from infra.kubectl import INSTALL_HINT, KubectlError
from infra.manifests import dump_all
from infra.names import credentials_command
from jobs.client.rayjob_status import Phase, one_line, phase, queue_of, workload_message
from jobs.runtime.deadlines import Deadline

POLL_S = 2.0  # between reads of the RayJob
KUBECTL_S = 30.0  # any one kubectl request
APPLY_S = 60.0
DELETE_S = 60.0  # the deletion (kubectl waits for the objects to be gone) on Ctrl-C or timeout
LOGS_AFTER_S = 20.0  # after the end, for the submitter's last log lines
API_LOST_S = 120.0  # reads that fail this long in a row end the follow (exit 2)
WORKLOAD_EVERY_S = 10.0  # while queued, how often Kueue's reason is read
SUBMITTER = "ray-job-submitter"  # KubeRay's submitter container (infra.manifests.rayjob)
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # on every pod of a batch Job (Kubernetes >= 1.27)


def kubectl(args: list[str], timeout_s: float, what: str, stdin: str | None = None) -> str:
    """kubectl's stdout; KubectlError, one line naming `what`, when it is missing, slow or refuses."""
    path = shutil.which("kubectl")
    if path is None:
        raise KubectlError(f"kubectl is not on PATH: {INSTALL_HINT}")
    try:
        proc = subprocess.run([path, *args], input=stdin, capture_output=True, text=True, timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        raise KubectlError(f"kubectl took over {max(timeout_s, 1.0):.0f} s to {what}") from None
    if proc.returncode:
        raise KubectlError(f"cannot {what}: {one_line(proc.stderr) or f'kubectl exited {proc.returncode}'}", answered=True)
    return proc.stdout


class Follower:
    """One RayJob and its NetworkPolicy, applied from `docs`, followed to the end."""

    def __init__(self, docs: list[dict[str, Any]], timeout_s: float, poll_s: float = POLL_S):
        job = next(d for d in docs if d["kind"] == "RayJob")
        self.docs, self.timeout_s, self.poll_s = docs, timeout_s, poll_s
        self.name, self.namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
        self.queue = queue_of(job)
        self.policies = [d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"]
        self.deadline = Deadline(timeout_s)
        self.phase = Phase("applying", "", "to be applied")
        self.logs: SubmitterLogs | None = None
        self.kueue_says = ""

    def say(self, line: str) -> None:
        print(f"rayjob {self.name}: {line}", flush=True)

    def error(self, line: str) -> None:
        """One line on stderr; it names the RayJob itself."""
        print(f"error: {line}", file=sys.stderr, flush=True)

    def what(self) -> str:
        policies = f" and NetworkPolicy {', '.join(self.policies)}" if self.policies else ""
        return f"RayJob {self.name}{policies} in namespace {self.namespace}"

    def bound(self, seconds: float = KUBECTL_S) -> float:
        return min(seconds, max(self.deadline.remaining(), 1.0))

    # -- apply, delete --------------------------------------------------------------------------

    def apply(self, env: Environment) -> bool:
        try:
            kubectl(["apply", "--server-side=false", "-f", "-"], self.bound(APPLY_S), f"apply {self.what()}", dump_all(self.docs))
        except KubectlError as err:
            if not err.answered:  # kubectl missing or slow: nothing reached the cluster to undo
                self.error(str(err))
            elif not self.delete(self.docs):  # refused: what came before the refusal is undone
                self.error(f"{err}; nothing of it is left applied")
            else:  # the cluster did not answer the delete either: kubectl's context is the likely cause
                self.error(f"{err}; is kubectl's context the cluster of environment {env.name}? {shlex.join(credentials_command(env))}")
            return False
        self.say(f"applied {self.what()}; following it (Ctrl-C deletes it)")
        self.own_policies()
        return True

    def own_policies(self) -> None:
        """Make the NetworkPolicy the RayJob's dependent, so it goes when the RayJob goes (and no
        sooner: the RayJob's pods outlive the job by ttlSecondsAfterFinished). A failure is a
        warning: the policy then stays until deleted by hand."""
        try:
            uid = kubectl(
                ["get", "rayjob", self.name, "-n", self.namespace, "-o", "jsonpath={.metadata.uid}"],
                self.bound(),
                f"read RayJob {self.name}",
            )
            owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": self.name, "uid": uid.strip()}
            patch = json.dumps({"metadata": {"ownerReferences": [owner]}})
            for policy in self.policies:
                args = ["patch", "networkpolicy", policy, "-n", self.namespace, "--type", "merge", "-p", patch]
                kubectl(args, self.bound(), f"make NetworkPolicy {policy} the RayJob's dependent")
        except KubectlError as err:
            self.error(f"warning: {err}; NetworkPolicy {', '.join(self.policies)} stays after RayJob {self.name} is deleted")

    def delete(self, docs: list[dict[str, Any]]) -> str:
        """Delete `docs` (the RayJob before its NetworkPolicy, so its pods are never left open),
        waiting, bounded, until they are gone; '' or '; <why it failed>' to append to a line."""
        names = ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in docs)
        by_hand = " ".join(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in reversed(docs))
        args = ["delete", "-f", "-", "--ignore-not-found", "--wait=true", f"--timeout={DELETE_S:.0f}s"]
        try:
            kubectl(args, DELETE_S + 15, f"delete {names}", dump_all(list(reversed(docs))))
        except KubectlError as err:
            return f"; {err} (`kubectl delete -n {self.namespace} {by_hand}` deletes it)"
        return ""

    # -- follow ---------------------------------------------------------------------------------

    def follow(self) -> int:
        lost_since: float | None = None
        admitted_before = False
        next_workload = 0.0
        while True:
            if self.deadline.expired():
                return self.timed_out()
            try:
                rayjob = json.loads(kubectl(self.get_args(), self.bound(), f"read RayJob {self.name}"))
                lost_since = None
            except (KubectlError, ValueError) as err:
                if isinstance(err, KubectlError) and err.answered and "NotFound" in str(err):
                    self.stop_logs()
                    self.error(f"RayJob {self.name} was deleted by someone else; it was waiting {self.phase.waiting_for}")
                    return 1
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > API_LOST_S:
                    self.stop_logs()
                    self.error(f"{one_line(str(err))}; gave up after {API_LOST_S:.0f} s of failed reads; RayJob {self.name} may still run")
                    return 2
                self.deadline.sleep(self.poll_s)
                continue
            now = phase(rayjob, admitted_before=admitted_before)
            self.changed(now)
            admitted_before = admitted_before or now.name not in ("applying", "queued", "suspended")
            if now.name == "queued" and time.monotonic() >= next_workload:
                self.why_queued(rayjob)
                next_workload = time.monotonic() + WORKLOAD_EVERY_S
            cluster = (rayjob.get("status") or {}).get("rayClusterName")
            if now.name == "Running" and cluster:
                self.logs = self.logs or SubmitterLogs(self.namespace, self.name)
                self.logs.keep_following(self.bound())
            if now.exit_code is not None:
                return self.ended(now, cluster)
            self.deadline.sleep(self.poll_s)

    def get_args(self) -> list[str]:
        return ["get", "rayjob", self.name, "-n", self.namespace, "-o", "json"]

    def changed(self, now: Phase) -> None:
        if now.name == self.phase.name:
            return
        # A RayJob Kueue held says it was admitted even when a poll missed the moment.
        if self.queue and self.phase.name in ("applying", "queued") and now.name not in ("queued", "admitted"):
            self.say(f"admitted by Kueue (LocalQueue {self.queue})")
        self.phase = now
        if now.exit_code is None:
            self.say(now.line)

    def why_queued(self, rayjob: dict[str, Any]) -> None:
        """Kueue's own reason, from the RayJob's Workload; nothing when it cannot be read."""
        uid = rayjob.get("metadata", {}).get("uid", "")
        args = ["get", "workloads.kueue.x-k8s.io", "-n", self.namespace, "-l", f"kueue.x-k8s.io/job-uid={uid}", "-o", "json"]
        try:
            reason = workload_message(json.loads(kubectl(args, self.bound(15.0), f"read RayJob {self.name}'s Kueue Workload")))
        except (KubectlError, ValueError):
            return
        if reason and reason != self.kueue_says:
            self.kueue_says = reason
            self.say(f"queued: Kueue says: {reason}")

    def ended(self, end: Phase, cluster: str | None) -> int:
        if cluster:
            (self.logs or SubmitterLogs(self.namespace, self.name)).finish(LOGS_AFTER_S)
        if end.exit_code:
            self.error(f"RayJob {self.name} {end.line}")
        else:
            self.say(end.line)
        if self.policies:
            self.say(f"its RayCluster goes with ttlSecondsAfterFinished; NetworkPolicy {', '.join(self.policies)} with the RayJob")
        return end.exit_code or 0

    def timed_out(self) -> int:
        self.stop_logs()
        with _uninterrupted():
            failed = self.delete(self.docs)
        self.error(f"waited {self.timeout_s:g} s for RayJob {self.name} {self.phase.waiting_for}; deleted {self.what()}{failed}")
        return 3

    def interrupted(self) -> int:
        with _uninterrupted():
            self.stop_logs()
            failed = self.delete(self.docs)
        self.error(f"interrupted: deleted {self.what()}{failed}; it was waiting {self.phase.waiting_for}")
        return 130

    def stop_logs(self) -> None:
        if self.logs:
            self.logs.stop()


class SubmitterLogs:
    """`kubectl logs -f` of the RayJob's submitter pod, copied to stdout line by line; restarted when
    the stream ends while the job runs (skipping what was printed of that pod), and moved to the
    Job's newer pod when it retried one."""

    def __init__(self, namespace: str, rayjob: str):
        self.namespace, self.rayjob = namespace, rayjob
        self.pod: str | None = None
        self.printed = 0
        self.proc: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None

    def submitter_pod(self, timeout_s: float) -> str | None:
        """The newest pod of the submitter Job (KubeRay names the Job after the RayJob)."""
        args = ["get", "pods", "-n", self.namespace, "-l", f"{JOB_NAME_LABEL}={self.rayjob}", "--sort-by=.metadata.creationTimestamp"]
        args += ["-o", "jsonpath={.items[*].metadata.name}"]
        try:
            names = kubectl(args, timeout_s, f"find RayJob {self.rayjob}'s submitter pod").split()
        except KubectlError:
            return None  # not there yet: the next poll tries again
        return names[-1] if names else None

    def keep_following(self, timeout_s: float, follow: bool = True) -> None:
        """Start the stream when none runs (the pod may not be there yet: the next call retries)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.reader is not None:
            self.reader.join(5.0)  # the last stream's lines are out before the next starts
        pod = self.submitter_pod(timeout_s)
        path = shutil.which("kubectl")
        if pod is None or path is None:
            return
        if pod != self.pod:
            self.pod, self.printed = pod, 0
        args = [path, "logs", "-n", self.namespace, pod, "-c", SUBMITTER, *(["-f"] if follow else [])]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace")
        self.reader = threading.Thread(target=self._copy, args=(self.proc.stdout, self.printed), daemon=True)
        self.reader.start()

    def _copy(self, stream: IO[str], skip: int) -> None:
        for seen, line in enumerate(stream, start=1):
            if seen > skip:
                sys.stdout.write(line)
                sys.stdout.flush()
                self.printed = seen

    def finish(self, timeout_s: float) -> None:
        """After the end: the rest of the log (the whole of it when no stream ran), bounded."""
        deadline = Deadline(timeout_s)
        if self.proc is None or (self.proc.poll() is not None and self.printed == 0):
            self.keep_following(deadline.remaining(), follow=False)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=deadline.remaining())
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if self.reader is not None:
            self.reader.join(5.0)


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """The clean-up (bounded) runs to its end: a second Ctrl-C would leave the RayJob holding its
    slice."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a cancelled Cloud Build step, a killed terminal) cleans up as Ctrl-C does."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_rayjob(env: Environment, docs: list[dict[str, Any]], timeout_s: float, *, poll_s: float = POLL_S) -> int:
    """Apply `docs` (a NetworkPolicy and a RayJob, `jobs.submit --print-rayjob`'s) with kubectl's
    current context, follow the RayJob to its end and return the exit status (module docstring)."""
    follower = Follower(docs, timeout_s, poll_s)
    with _sigterm_as_interrupt():
        try:
            if not follower.apply(env):
                return 2
            return follower.follow()
        except KeyboardInterrupt:
            return follower.interrupted()
