"""A local stand-in for the Kubernetes API server: just enough of it for the real `kubectl` to talk
to it over real HTTP, and a kubeconfig that points kubectl there. The only fake in these tests is
the cluster itself.

- Secrets and CRDs to read (`kubectl get`).
- RayJobs (`ray.io/v1`) and NetworkPolicies to `kubectl apply` (client-side: GET, then POST or a
  merge PATCH), `get -o json` and `delete`. A RayJob is checked as the API server checks it under
  `fieldValidation=Strict` (kubectl's default): against the RayJob CRD's schema (tests/kuberay_schema),
  an unknown field is a 400 and any other violation a 422, as kubectl prints them.
- What the operators would do with an applied RayJob, for real: Kueue (tests/fake_kueue.py) holds
  one labelled `kueue.x-k8s.io/queue-name` suspended (its Workload pending) for at least
  `admit_after_s`, then admits it when the ported arithmetic says it fits the ClusterQueue printed
  for the environment (`kueue_docs`), or preempts lower-priority jobs for it; KubeRay's part is
  `python -m jobs.local rayjob` on the RayJob (a simulated slice of its shape, its submitter run,
  its deadlines enforced), whose status lines become the RayJob's `.status` and whose log file is
  the submitter pod's `ray-job-submitter` container log (`kubectl logs [-f]`). Deleting the RayJob
  interrupts that run (SIGINT, bounded); an evicted one is interrupted and shows Suspended.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fake_kueue import QUEUE_LABEL, FakeKueue
from tests.fake_rayjobs import STOP_S, SUBMITTER, TERMINAL, RayJobRun, submitter_pod
from tests.kuberay_schema import validator

REPO = Path(__file__).resolve().parents[1]
KUBERAY_CRDS = REPO.parent / "shared" / "kuberay" / "crds"

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"


def _resource(name: str, kind: str, *, namespaced: bool = True, verbs: tuple[str, ...] = ("get", "list"), **extra: Any) -> dict[str, Any]:
    return {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind, "verbs": list(verbs), **extra}


WRITE = ("create", "delete", "get", "list", "patch", "update")
GROUPS = {  # group -> (version, its resources)
    "apiextensions.k8s.io": (
        "v1",
        [_resource("customresourcedefinitions", "CustomResourceDefinition", namespaced=False, shortNames=["crd", "crds"])],
    ),
    "ray.io": ("v1", [_resource("rayjobs", "RayJob", verbs=WRITE, categories=["all"])]),
    "networking.k8s.io": ("v1", [_resource("networkpolicies", "NetworkPolicy", verbs=WRITE, shortNames=["netpol"])]),
    "kueue.x-k8s.io": ("v1beta2", [_resource("workloads", "Workload", shortNames=["wl"])]),
}
CORE = [
    _resource("secrets", "Secret"),
    _resource("pods", "Pod", shortNames=["po"]),
    {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
]
DISCOVERY: dict[str, dict[str, Any]] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": group,
                "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
                "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version},
            }
            for group, (version, _) in GROUPS.items()
        ],
    },
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": CORE},
    **{
        f"/apis/{group}/{version}": {"kind": "APIResourceList", "groupVersion": f"{group}/{version}", "resources": resources}
        for group, (version, resources) in GROUPS.items()
    },
}


def _openapi(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    """An OpenAPI v3 document for one group-version that says its PATCH takes `fieldValidation`:
    what kubectl looks for before it leaves validation to the server (else it validates against
    the OpenAPI v2 schema itself, which this fake does not serve)."""
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    patch = {
        "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind},
        "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}],
        "responses": {"200": {"description": "OK"}},
    }
    paths = {f"{prefix}/namespaces/{{namespace}}/{plural}/{{name}}": {"patch": patch}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths, "components": {"schemas": {}}}


OPENAPI = {
    "apis/ray.io/v1": _openapi("ray.io", "v1", "RayJob", "rayjobs"),
    "apis/networking.k8s.io/v1": _openapi("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies"),
}
DISCOVERY["/openapi/v3"] = {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash=fake"} for gv in OPENAPI}}
DISCOVERY.update({f"/openapi/v3/{gv}": doc for gv, doc in OPENAPI.items()})
KINDS = {"rayjobs": "RayJob", "networkpolicies": "NetworkPolicy", "pods": "Pod", "workloads": "Workload"}
API_VERSIONS = {"rayjobs": "ray.io/v1", "networkpolicies": "networking.k8s.io/v1", "pods": "v1", "workloads": "kueue.x-k8s.io/v1beta2"}
WRITABLE = ("rayjobs", "networkpolicies")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, **details: Any) -> tuple[int, dict[str, Any]]:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return code, body


def _not_found(resource: str, name: str) -> tuple[int, dict[str, Any]]:
    return _status(404, "NotFound", f'{resource} "{name}" not found', name=name, kind=resource)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, what kubectl's client-side apply sends for a custom resource."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.replace("==", "=").partition("=")
        if labels.get(key) != value:
            return False
    return True


@dataclass
class FakeKube:
    url: str = ""
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # (namespace, name) -> data
    crds: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the CRD object
    crd_dir: Path = KUBERAY_CRDS  # the RayJob CRD strict validation checks against
    admit_after_s: float = 5.0  # how long Kueue holds a queued RayJob before admitting it
    kueue_docs: list[dict[str, Any]] = field(default_factory=list)  # `python -m infra manifests`' Kueue objects
    kueue: FakeKueue | None = None
    evicted: set[str] = field(default_factory=set)  # uids of RayJobs Kueue evicted, until admitted again
    evictions: list[str] = field(default_factory=list)  # the names of the RayJobs Kueue evicted, in order
    errors: list[str] = field(default_factory=list)  # tracebacks of the fake operators' own failures
    # KubeRay's part: what runs an admitted RayJob (its file and flags appended); None runs nothing.
    rayjob_command: list[str] | None = field(default_factory=lambda: [sys.executable, "-m", "jobs.local", "rayjob"])
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (resource, namespace, name) -> object
    runs: dict[str, RayJobRun] = field(default_factory=dict)  # a RayJob's uid -> its run, kept once it is deleted
    requests: list[str] = field(default_factory=list)  # "METHOD /path?query", in order
    lock: threading.RLock = field(default_factory=threading.RLock)

    # -- reads ----------------------------------------------------------------------------------

    def answer(self, path: str, query: dict[str, list[str]] | None = None) -> tuple[int, dict[str, Any]]:
        if path in DISCOVERY:
            return 200, DISCOVERY[path]
        parts = path.strip("/").split("/")
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
            data = self.secrets.get((parts[3], parts[5]))
            if data is not None:
                encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
                return 200, {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": parts[5], "namespace": parts[3]}, "data": encoded}
            return _not_found("secrets", parts[5])
        if path.startswith(CRD_PATH):
            name = path[len(CRD_PATH) :]
            return (200, self.crds[name]) if name in self.crds else _not_found("customresourcedefinitions.apiextensions.k8s.io", name)
        target = _target(parts)
        if target is None:
            return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}
        resource, namespace, name = target
        with self.lock:
            found = self._current(resource, namespace)
        if not name:
            selector = (query or {}).get("labelSelector", [""])[0]
            items = [o for o in found.values() if _matches(o["metadata"].get("labels", {}), selector)]
            kind = KINDS[resource]
            return 200, {"kind": f"{kind}List", "apiVersion": API_VERSIONS[resource], "metadata": {"resourceVersion": "1"}, "items": items}
        return (200, found[name]) if name in found else _not_found(f"{resource}.{API_VERSIONS[resource].split('/')[0]}", name)

    def _current(self, resource: str, namespace: str) -> dict[str, dict[str, Any]]:
        """The namespace's objects of `resource` as they are now: a RayJob's status from its run,
        and what the operators would have made for it (its head pod, its Kueue Workload)."""
        out: dict[str, dict[str, Any]] = {}
        for (res, ns, name), obj in self.objects.items():
            if ns != namespace or res != "rayjobs":
                if (res, ns) == (resource, namespace):
                    out[name] = obj
                continue
            job = self._with_status(obj)
            if resource == "rayjobs":
                out[name] = job
            elif resource == "pods" and (pod := submitter_pod(job)):
                out[pod["metadata"]["name"]] = pod
            elif resource == "workloads" and (held := self.queued().workload(job["metadata"]["uid"])):
                out[held["metadata"]["name"]] = held
        return out

    def queued(self) -> FakeKueue:
        if self.kueue is None:
            self.kueue = FakeKueue(self.kueue_docs, self.admit_after_s)
        return self.kueue

    def _with_status(self, job: dict[str, Any]) -> dict[str, Any]:
        uid = job["metadata"]["uid"]
        run = self.runs.get(uid)
        if uid in self.evicted:  # KubeRay: Suspending while the cluster goes, then Suspended
            stopping = run is not None and run.running()
            return {**job, "status": {"jobDeploymentStatus": "Suspending" if stopping else "Suspended", "jobStatus": ""}}
        if run is None:
            return job
        return {**job, "status": run.status()}

    # -- writes ---------------------------------------------------------------------------------

    def create(self, path: str, query: dict[str, list[str]], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        target = _target(path.strip("/").split("/"))
        if target is None or target[0] not in WRITABLE or target[2]:
            return _status(405, "MethodNotAllowed", f"the fake API server does not create at {path}")
        resource, namespace, _ = target
        name = body.get("metadata", {}).get("name", "")
        if refused := self._refused(resource, body, query):
            return refused
        with self.lock:
            if (resource, namespace, name) in self.objects:
                return _status(409, "AlreadyExists", f'{resource} "{name}" already exists')
            obj = copy.deepcopy(body)
            obj.pop("status", None)  # a status subresource: what is sent with the object is dropped
            meta = obj["metadata"]
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion="1", generation=1)
            self.objects[(resource, namespace, name)] = obj
            if resource == "rayjobs":
                self._queue(obj) if QUEUE_LABEL in meta.get("labels", {}) else self._start(obj)
        return 201, self.answer(path.rstrip("/") + "/" + name)[1]

    def patch(self, path: str, query: dict[str, list[str]], patch: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        target = _target(path.strip("/").split("/"))
        if target is None or target[0] not in WRITABLE or not target[2]:
            return _status(405, "MethodNotAllowed", f"the fake API server does not patch at {path}")
        resource, namespace, name = target
        with self.lock:
            current = self.objects.get((resource, namespace, name))
            if current is None:
                return _not_found(resource, name)
            updated = _merge_patch(current, patch)
            if refused := self._refused(resource, updated, query):
                return refused
            updated["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
            self.objects[(resource, namespace, name)] = updated
        return 200, self.answer(path)[1]

    def delete(self, path: str) -> tuple[int, dict[str, Any]]:
        target = _target(path.strip("/").split("/"))
        if target is None or target[0] not in WRITABLE or not target[2]:
            return _status(405, "MethodNotAllowed", f"the fake API server does not delete at {path}")
        resource, namespace, name = target
        with self.lock:
            current = self.answer(path)[1]
            if self.objects.pop((resource, namespace, name), None) is None:
                return _not_found(resource, name)
            run = self.runs.get(current["metadata"]["uid"]) if resource == "rayjobs" else None
            if resource == "rayjobs":
                self.queued().remove(current["metadata"]["uid"])
        if run is not None:  # KubeRay deletes the RayCluster with its RayJob: the run is interrupted
            self._background(run.stop)
        return 200, current

    def _refused(self, resource: str, obj: dict[str, Any], query: dict[str, list[str]]) -> tuple[int, dict[str, Any]] | None:
        """The API server's answer to an invalid RayJob, as `fieldValidation=Strict` makes it."""
        if resource != "rayjobs":
            return None
        name = obj.get("metadata", {}).get("name", "")
        problems = list(validator(str(self.crd_dir), "RayJob").iter_errors({k: v for k, v in obj.items() if k != "status"}))
        unknown = [e for e in problems if e.validator == "additionalProperties"]
        strict = query.get("fieldValidation", ["Strict"])[0] == "Strict"
        if unknown and strict:
            fields = []
            for error in unknown:
                allowed = error.schema.get("properties", {})
                fields += [".".join([*map(str, error.absolute_path), key]) for key in error.instance if key not in allowed]
            listed = ", ".join(f'unknown field "{f}"' for f in fields)
            return _status(400, "BadRequest", f'RayJob in version "v1" cannot be handled as a RayJob: strict decoding error: {listed}')
        invalid = [e for e in problems if e.validator != "additionalProperties"]
        if invalid:
            # kubectl prints "The RayJob "x" is invalid: <field>: <message>" from the causes.
            causes = [
                {
                    "reason": "FieldValueInvalid",
                    "field": ".".join(map(str, e.absolute_path)),
                    "message": f"Invalid value: {json.dumps(e.instance)}: {e.message}",
                }
                for e in invalid
            ]
            listed = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
            return _status(
                422, "Invalid", f'RayJob.ray.io "{name}" is invalid: {listed}', name=name, group="ray.io", kind="RayJob", causes=causes
            )
        return None

    # -- the operators --------------------------------------------------------------------------

    def _queue(self, job: dict[str, Any]) -> None:
        """Kueue's webhook suspends the RayJob on creation; KubeRay shows it Suspended until Kueue
        admits its Workload (tests/fake_kueue.py), which the scheduler loop decides."""
        job["spec"]["suspend"] = True
        job["status"] = {"jobDeploymentStatus": "Suspended", "jobStatus": ""}
        self.queued().add(job)

    def schedule(self) -> None:
        """One pass of Kueue's scheduler over the queued RayJobs."""
        with self.lock:
            self.queued().schedule(self._admit, self._evict, self._stopped, self._finished)

    def _admit(self, job: dict[str, Any]) -> None:
        job["spec"]["suspend"] = False
        job["status"] = {}  # Suspended -> New: KubeRay starts it over
        self.evicted.discard(job["metadata"]["uid"])
        self._start(job)

    def _evict(self, job: dict[str, Any]) -> None:
        """Kueue suspends the RayJob; KubeRay deletes its cluster and submitter (the run is stopped)."""
        job["spec"]["suspend"] = True
        uid = job["metadata"]["uid"]
        self.evicted.add(uid)
        self.evictions.append(job["metadata"]["name"])
        run = self.runs.get(uid)
        if run is not None:
            self._background(run.stop)

    def _finished(self, uid: str) -> bool:
        run = self.runs.get(uid)
        return run is not None and uid not in self.evicted and run.status().get("jobDeploymentStatus") in TERMINAL

    def _stopped(self, uid: str) -> bool:
        run = self.runs.get(uid)
        return run is None or not run.running()

    def _start(self, job: dict[str, Any]) -> None:
        if self.rayjob_command is None:
            return
        spec = {k: v for k, v in job.items() if k != "status"}
        earlier = self.runs.get(job["metadata"]["uid"])
        self.runs[job["metadata"]["uid"]] = RayJobRun.start(spec, self.rayjob_command, earlier.directory if earlier else None)

    def _background(self, fn: Any) -> None:
        threading.Thread(target=fn, daemon=True).start()

    def wait_for_runs(self, timeout_s: float = STOP_S + 30) -> list[RayJobRun]:
        """Wait, bounded, for every run to end (a finished job's, a deleted RayJob's); the ones
        still running."""
        deadline = time.monotonic() + timeout_s
        for run in list(self.runs.values()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        return [run for run in self.runs.values() if run.running()]

    def close(self) -> None:
        """Stop every run still going (as a deleted RayJob's is) and clean up after them."""
        for run in list(self.runs.values()):
            run.stop()
            run.clean_up()

    def log(self, namespace: str, pod: str, container: str) -> RayJobRun | None:
        """The run whose submitter pod this is, when `container` is its submitter."""
        with self.lock:
            pods = self._current("pods", namespace)
            if pod not in pods or container != SUBMITTER:
                return None
            for run in self.runs.values():
                cluster = run.status().get("rayClusterName", "")
                if cluster and pod.endswith(cluster[-5:]):  # a pod of this admission's submitter Job
                    return run
        return None

    def kubeconfig(self, directory: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "me", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
            "current-context": "fake",
        }
        path = directory / "kubeconfig"
        path.write_text(json.dumps(config))
        return path


def _target(parts: list[str]) -> tuple[str, str, str] | None:
    """(resource, namespace, name; "" for the collection) of a namespaced object path of ours."""
    if parts[:3] == ["api", "v1", "namespaces"]:
        rest = parts[3:]
    elif len(parts) >= 4 and parts[0] == "apis" and parts[3] == "namespaces":
        rest = parts[4:]
    else:
        return None
    if len(rest) not in (2, 3) or rest[1] not in KINDS:
        return None
    return rest[1], rest[0], rest[2] if len(rest) == 3 else ""


@contextlib.contextmanager
def serve(kube: FakeKube) -> Iterator[FakeKube]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _parsed(self) -> tuple[str, dict[str, list[str]]]:
            kube.requests.append(f"{self.command} {self.path}")
            url = urlsplit(self.path)
            return url.path, parse_qs(url.query)

        def _body(self) -> dict[str, Any]:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

        def do_GET(self) -> None:
            path, query = self._parsed()
            parts = path.strip("/").split("/")
            if len(parts) == 7 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods" and parts[6] == "log":
                self._log(parts[3], parts[5], query)
            else:
                self._send(*kube.answer(path, query))

        def do_POST(self) -> None:
            path, query = self._parsed()
            self._send(*kube.create(path, query, self._body()))

        def do_PATCH(self) -> None:
            path, query = self._parsed()
            self._send(*kube.patch(path, query, self._body()))

        def do_DELETE(self) -> None:
            path, _ = self._parsed()
            self._send(*kube.delete(path))

        def _log(self, namespace: str, pod: str, query: dict[str, list[str]]) -> None:
            """The container's log, followed until its run ends when asked to (`follow=true`)."""
            container = query.get("container", [""])[0]
            run = kube.log(namespace, pod, container)
            if run is None:
                self._send(*_status(400, "BadRequest", f"container {container} is not valid for pod {pod}"))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()  # no length: the body ends when the connection closes
            follow = query.get("follow", ["false"])[0] == "true"
            offset = 0
            try:
                while True:
                    # The submitter's `ray job submit` exits when the job ends; read before the
                    # file, so that nothing written last is missed.
                    ended = not run.running() or run.status().get("jobDeploymentStatus") in TERMINAL
                    with open(run.log_path(), "rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    if chunk:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        offset += len(chunk)
                    if not follow or (ended and not chunk) or kube.log(namespace, pod, container) is None:
                        return
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError):
                return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stopping = threading.Event()

    def scheduler() -> None:  # Kueue's scheduling loop; an error of the fake's own is kept for the test to see
        while not stopping.wait(0.5):
            try:
                kube.schedule()
            except Exception:
                kube.errors.append(traceback.format_exc())
                raise

    threading.Thread(target=scheduler, daemon=True).start()
    kube.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield kube
    finally:
        stopping.set()
        server.shutdown()
        kube.close()
