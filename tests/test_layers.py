"""The import rules of the layout, checked from the source (every import, function-level included):

- `infra` never imports `jobs`; only `infra.cdk` (and `infra.app`, the entry point cdktf.json runs)
  imports cdktf, constructs or the provider bindings.
- `jobs` is layered: the package root, then `jobs.runtime` (runs on the cluster: no argparse, no
  print), then `jobs.cli` (the shared flags), then the roles (train, serve, healthcheck, local,
  client, batch), then the entry points (submit, demo, serve_demo, serve_smoke, export). A module imports its own
  role and lower layers only; one role never imports another, except where ALLOWED says why.
- No import cycles between modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import REPO_ROOT

PACKAGES = ("infra", "jobs")
CDK_IMPORTS = ("cdktf", "constructs", "cdktf_cdktf_provider_google")
# (module prefix, layer); the longest matching prefix wins.
JOBS_LAYERS = {
    "jobs": 0,
    "jobs.runtime": 1,
    "jobs.cli": 2,
    "jobs.train": 3,
    "jobs.serve": 3,
    "jobs.healthcheck": 3,
    "jobs.local": 3,
    "jobs.client": 3,
    "jobs.batch": 3,
    "jobs.submit": 4,
    "jobs.demo": 4,
    "jobs.serve_demo": 4,
    "jobs.serve_smoke": 4,
    "jobs.export": 4,
    "jobs.goodput": 4,
}
# Imports across roles of one layer, each with its reason.
ALLOWED = {
    ("jobs.serve.smoke", "jobs.client"): "the serving smoke test is a laptop-side client: it reuses the port-forward",
    ("jobs.local.rayjob", "jobs.client"): "it submits as KubeRay's submitter would, through the same bounded Jobs API client",
    ("jobs.batch.__main__", "jobs.serve"): "batch runs the CPU engine with serving's offline settings, one definition of them",
    ("jobs.batch.prompts", "jobs.train"): "prompts are found as `jobs.train --data` finds text files, one reader of that rule",
}


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = modules()


def imports(path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file; `from a import b` is `a.b` when that is
    one of our modules, else `a`."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield (sub if sub in MODULES else node.module), node.lineno


def ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def role(name: str) -> tuple[str, int]:
    prefix = max((p for p in JOBS_LAYERS if name == p or name.startswith(p + ".")), key=len)
    return prefix, JOBS_LAYERS[prefix]


def test_the_source_tree_is_found():
    assert {"infra.config", "jobs.runtime.reservation", "jobs.train.fit", "jobs.submit"} <= set(MODULES)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("infra")))
def test_infra_never_imports_jobs_and_only_infra_cdk_imports_cdktf(module):
    for name, line in imports(MODULES[module]):
        assert name.split(".")[0] != "jobs", f"{module}:{line} imports {name}: infra must not depend on jobs"
        if name.split(".")[0] in CDK_IMPORTS:
            assert module.startswith("infra.cdk") or module == "infra.app", f"{module}:{line} imports {name} outside infra.cdk"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("jobs")))
def test_jobs_import_their_own_role_and_lower_layers_only(module):
    mine, layer = role(module)
    for name, line in imports(MODULES[module]):
        if not name.startswith("jobs"):
            continue
        theirs, their_layer = role(name)
        if theirs == mine or their_layer < layer:
            continue
        assert (mine, theirs) in ALLOWED or (module, theirs) in ALLOWED, (
            f"{module}:{line} imports {name} ({theirs}, layer {their_layer}) from layer {layer}: "
            "a lower layer never imports a higher one, and one role never imports another"
        )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("jobs.runtime")))
def test_the_runtime_has_no_command_line_and_prints_nothing(module):
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            assert "argparse" not in names, f"{module}:{node.lineno} imports argparse"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "print", f"{module}:{node.lineno} prints"


def test_no_import_cycles():
    graph = {m: {n for n, _ in imports(p) if n in MODULES and n != m} for m, p in MODULES.items()}
    # A package's __init__ re-exporting its submodules is not a cycle with them: leave out edges
    # from a submodule to its own package root.
    graph = {m: {n for n in deps if not m.startswith(n + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
