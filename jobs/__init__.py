"""Ray/JAX workloads that run on whole TPU slices.

Each workload is a module run as `python -m jobs.NAME` (locally or through `ray job submit`):

- `jobs.healthcheck`: one all-reduce over every chip of a slice, checked.
- `jobs.train`: a small decoder-only transformer trained with Ray Train's JaxTrainer.
- `jobs.local`: a simulated slice on this machine (`up`, `status`, `down`).
- `jobs.demo`: what `make demo` runs: up, healthcheck, train, summary, down.

Kept light on purpose: importing `jobs` imports neither Ray nor JAX. The TPU shapes come from
`infra.catalog` and the defaults from `infra.config`; nothing here imports cdktf.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
