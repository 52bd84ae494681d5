"""A local stand-in for the Kubernetes API server: just enough of it (discovery, Secrets, CRDs) for
the real `kubectl get` to talk to it over real HTTP, and a kubeconfig that points kubectl there.
The only fake in these tests is the cluster itself."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
DISCOVERY: dict[str, dict[str, Any]] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": "apiextensions.k8s.io",
                "versions": [{"groupVersion": "apiextensions.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "apiextensions.k8s.io/v1", "version": "v1"},
            }
        ],
    },
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [{"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret", "verbs": ["get", "list"]}],
    },
    "/apis/apiextensions.k8s.io/v1": {
        "kind": "APIResourceList",
        "groupVersion": "apiextensions.k8s.io/v1",
        "resources": [
            {
                "name": "customresourcedefinitions",
                "singularName": "customresourcedefinition",
                "namespaced": False,
                "kind": "CustomResourceDefinition",
                "shortNames": ["crd", "crds"],
                "verbs": ["get", "list"],
            }
        ],
    },
}


@dataclass
class FakeKube:
    url: str = ""
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # (namespace, name) -> data
    crds: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the CRD object

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
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
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}

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


def _not_found(resource: str, name: str) -> tuple[int, dict[str, Any]]:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
    return 404, {**status, "message": f'{resource} "{name}" not found'}


@contextlib.contextmanager
def serve(kube: FakeKube) -> Iterator[FakeKube]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            code, body = kube.answer(self.path.split("?")[0])
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kube.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield kube
    finally:
        server.shutdown()
