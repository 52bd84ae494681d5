"""Ray/JAX workloads that run on whole TPU slices, and what runs them.

Commands (`python -m jobs.NAME`, locally or through `ray job submit`): `healthcheck` (one checked
all-reduce over every chip), `train` (a decoder-only LM with Ray Train's JaxTrainer), `serve` (Ray
Serve LLM), `local` (a simulated slice: up, status, down), `submit` (a workload to a cluster from a
laptop or Cloud Build), `demo` (what `make demo` runs), `serve_demo`, `serve_smoke`.

Packages by role, lowest first: `runtime` (on the cluster, under every workload), `cli` (shared
flags), then `train`, `serve`, `local`, `client`; the entry points sit on top.

Kept light on purpose: importing `jobs` imports neither Ray nor JAX. The TPU shapes come from
`infra.catalog` and the defaults from `infra.config`; nothing here imports cdktf.
"""

from infra import REPO_ROOT

__all__ = ["REPO_ROOT"]
