"""What a layer keeps for the backward pass, by name (ModelConfig.remat), as MaxText names its
policies (`remat_policy`; its decoders.py maps each to a `jax.checkpoint_policies` policy over the
`checkpoint_name`s its layers attach), and how many bytes each keeps per token:

- `none`: everything (no rematerialization).
- `minimal`: every projection's output (q, k, v, the attention output's projection, the MLP's three
  matmuls); the elementwise work between them is recomputed. MaxText's `minimal`.
- `save_dots`: the attention projections only (q, k, v, out); the MLP is recomputed. MaxText's
  `save_dot_except_mlp`.
- `full`: nothing but each layer's input (the scan's carry): the whole layer recomputed.
- `offloaded`: `minimal`'s tensors, kept in the host's pinned memory instead of HBM (TPU only;
  MaxText's `minimal_offloaded`).

`jax.checkpoint(..., prevent_cse=False)`: inside `lax.scan` the CSE barrier is not needed (JAX's
own guidance, and MaxText sets it so for scanned layers).

Only JAX and NumPy: loads by path with jobs/train/model.py (bench/gpu_mfu.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

POLICIES = ("none", "minimal", "save_dots", "full", "offloaded")
# The names the layer gives its tensors (jax.ad_checkpoint.checkpoint_name), MaxText's own.
QKV = ("query_proj", "key_proj", "value_proj")
ATTENTION_DOTS = (*QKV, "out_proj")
MLP_DOTS = ("mlpwi_0", "mlpwi_1", "mlpwo")
SAVED: dict[str, tuple[str, ...]] = {
    "none": (),  # all of them, and everything else
    "minimal": (*ATTENTION_DOTS, *MLP_DOTS),
    "save_dots": ATTENTION_DOTS,
    "full": (),
    "offloaded": (),  # in host memory: (*ATTENTION_DOTS, *MLP_DOTS)
}


def policy(name: str) -> Any:
    """The `jax.checkpoint` policy of `name` (None for `none`: no checkpoint at all)."""
    import jax

    policies = jax.checkpoint_policies
    if name == "none":
        return None
    if name == "full":
        return policies.nothing_saveable
    if name == "offloaded":
        return policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=[*ATTENTION_DOTS, *MLP_DOTS],
            offload_src="device",
            offload_dst="pinned_host",
        )
    if name in SAVED:
        return policies.save_only_these_names(*SAVED[name])
    raise ValueError(f"remat policy {name!r} is not one of {', '.join(POLICIES)}")


def wrap(layer: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`layer` under policy `name`, for `lax.scan`."""
    import jax

    if name == "none":
        return layer
    return jax.checkpoint(layer, policy=policy(name), prevent_cse=False)


def saved_bytes_per_token(
    name: str, *, d_model: int, q_width: int, kv_width: int, d_ff: int, heads: int, seq: int, dtype_bytes: int = 2
) -> int:
    """Device bytes one layer keeps per token for the backward pass under policy `name`: the layer's
    input (the scan's carry) and the tensors the policy saves; `none` adds what the layer computes
    besides (the norms' outputs, rotated q and k, the attention's output, the MLP's activation),
    and the float32 attention scores of the XLA implementation (pure; an estimate, for choosing a
    preset's default)."""
    sizes = {"query_proj": q_width, "key_proj": kv_width, "value_proj": kv_width, "out_proj": d_model}
    sizes |= {"mlpwi_0": d_ff, "mlpwi_1": d_ff, "mlpwo": d_model}
    carry = d_model * dtype_bytes
    if name in ("full", "offloaded"):
        return carry
    if name == "none":
        everything = sum(sizes.values()) + 2 * d_model + q_width + kv_width + q_width + d_ff
        return carry + everything * dtype_bytes + heads * seq * 4
    return carry + sum(sizes[n] for n in SAVED[name]) * dtype_bytes
