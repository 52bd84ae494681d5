"""A simulated TPU slice on this machine: a real local Ray cluster, one raylet per simulated host.

    python -m jobs.local up --generation v6e --topology 4x4 [--slices N]
    python -m jobs.local status
    python -m jobs.local down
    eval "$(python -m jobs.local env)"   # RAY_ADDRESS and the token file, for `ray job submit`
    python -m jobs.local rayjob FILE --state-dir DIR   # a printed RayJob, as KubeRay runs it (jobs.local.rayjob)
    python -m jobs.local preempt --state-dir DIR       # ... evicted as Kueue evicts it (jobs.local.preempt)
    python -m jobs.local kill-host --slice I --host J [--notice S] [--back-after S]   # a host preempted or lost (jobs.local.faults)

Each simulated host is a `ray start --block` process started with the variables the GKE TPU
webhook injects (`TPU_NAME`, `TPU_WORKER_ID`, `TPU_ACCELERATOR_TYPE`, `TPU_TOPOLOGY`) and
`resources={"TPU": chips_per_host}`, so Ray derives exactly the labels and head resource it would
on GKE, and `ray.util.tpu` and Ray Train treat it as a slice. JAX runs on CPU with one device per
chip. The jobs need no change to run here: submit them with `ray job submit` to the printed address.

State and Ray's temp files live under `build/local-ray/` in the repo (or `--state-dir`), never in
`/tmp/ray` or `~/.ray`. Token authentication is on, as on GKE: each `up` writes a new random token to
`<state dir>/auth_token` (mode 0600), every node reads it from there (`RAY_AUTH_TOKEN_PATH`), and
`python -m jobs.local env` prints the lines that point a shell's `ray job submit` at it. Nodes start one after another (raylets on one machine pick their socket
names when they start, so starting them together makes them collide), each with a bounded wait;
`up` fails naming the host whose raylet did not come up and the log to read.
"""

from jobs.local.cluster import (
    DEFAULT_STATE_DIR,
    LocalCluster,
    LocalClusterError,
    LocalNode,
    LocalStatus,
    down,
    status,
    up,
)
from jobs.local.env import TOKEN_FILE, client_exports, cpu_jax_env, host_env, ray_env, slice_name, state_dir_problem

__all__ = [
    "TOKEN_FILE",
    "client_exports",
    "DEFAULT_STATE_DIR",
    "LocalCluster",
    "LocalClusterError",
    "LocalNode",
    "LocalStatus",
    "cpu_jax_env",
    "down",
    "host_env",
    "ray_env",
    "slice_name",
    "state_dir_problem",
    "status",
    "up",
]
