"""Serving the environment's LLM with Ray Serve LLM + vLLM, on the cluster and on this machine.

- `jobs.serve:build_app` (app.py): the Serve application builder the RayService and `serve run` name;
  `python -m jobs.serve` deploys it or prints its LLMConfig (`--print-config`) or the code upload
  (`--print-code-sync`).
- local.py: a local Ray + Serve on CPU with a model deployed as the RayService deploys it (the
  demo, the serving tests, `make bench`).
- demo.py: `make serve-demo` (`python -m jobs.serve_demo`), the tiny model served locally on CPU.
- smoke.py: `make serve-smoke` (`python -m jobs.serve_smoke`), a laptop-side query of the deployed
  RayService through a port-forward.
- tiny_model.py: a random tiny Llama written with `tokenizers` + `safetensors` (no hub download).

Importing this package imports neither Ray nor vLLM.
"""

from __future__ import annotations

from typing import Any

from jobs.serve.app import build_app

__all__ = ["build_app"]


def __getattr__(name: str) -> Any:
    # `jobs.serve:app` (serve run, import paths) builds the $RAY_TPU_GKE_ENV app on first access,
    # so that importing the package stays cheap.
    if name == "app":
        return build_app({})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
