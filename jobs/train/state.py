"""The sharded model and optimizer of one training worker: a (data, fsdp) mesh over every chip
(fsdp: the chips of a slice, by default), parameters and optimizer state sharded over fsdp and
replicated over data, and the compiled step."""

from __future__ import annotations

import time
from typing import Any

from jobs.train.config import TrainConfig
from jobs.train.model import ModelConfig


class ShardedState:
    """The sharded model, optimizer and compiled step of one worker."""

    def __init__(self, config: TrainConfig, *, initialize: bool = True):
        """`initialize=False` leaves the parameters to `load` (a checkpoint) or `start_from`."""
        import jax
        import jax.numpy as jnp
        import numpy as np
        import optax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        from jobs.train.model import (
            DATA_AXIS,
            FSDP_AXIS,
            batch_spec,
            init_params,
            make_optimizer,
            param_specs,
            shapes,
            train_step_with_metrics,
        )

        self.cfg = ModelConfig(**config.model)
        self.platform = jax.devices()[0].platform
        # bf16 matmuls on accelerators (float32 parameters and optimizer state), float32 on CPU.
        self.compute_dtype = jnp.bfloat16 if self.platform in ("tpu", "gpu") else jnp.float32
        fsdp = config.fsdp or jax.local_device_count()
        if jax.device_count() % fsdp or config.global_batch % jax.device_count():
            raise ValueError(
                f"--fsdp {fsdp} must divide the {jax.device_count()} chips and --batch-size {config.global_batch} "
                f"must be a multiple of them"
            )
        # Devices in process order (Ray Train's ranks: slice by slice, host by host), so a mesh row
        # is one slice's chips and each process owns a contiguous block of the batch (what
        # make_array_from_process_local_data expects).
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        self.mesh = Mesh(np.array(devices).reshape(-1, fsdp), (DATA_AXIS, FSDP_AXIS))
        self.batch_sharding = NamedSharding(self.mesh, batch_spec())
        replicated = NamedSharding(self.mesh, P())

        # Shardings from the shapes alone: a run that restores a checkpoint or imports a model
        # (`start_from`) never builds the random parameters it would throw away.
        abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, np.float32), shapes(self.cfg), is_leaf=lambda s: isinstance(s, tuple))
        param_sharding = jax.tree.map(lambda s: NamedSharding(self.mesh, s), param_specs(abstract, fsdp))
        self.param_sharding = param_sharding
        self.optimizer = make_optimizer(config.learning_rate, config.warmup_steps, config.steps)
        # Optimizer moments take their parameter's sharding; scalars (step counts) are replicated.
        opt_sharding = optax.tree_map_params(
            self.optimizer,
            lambda _, sharding: sharding,
            jax.eval_shape(self.optimizer.init, abstract),
            param_sharding,
            transform_non_params=lambda _: replicated,
        )
        self._abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, param_sharding)
        self._abstract_opt = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), jax.eval_shape(self.optimizer.init, abstract), opt_sharding
        )
        self._init_opt = jax.jit(self.optimizer.init, out_shardings=opt_sharding)
        self.params: Any = None
        self.opt_state: Any = None
        self.global_batch = config.global_batch
        self._compiled: Any = None  # compile_step's executable
        if initialize:
            self.start_from(init_params(self.cfg, config.seed))  # numpy, identical on every host

        self.grad_norm = 0.0  # the last step's, before clipping
        self._step = jax.jit(
            train_step_with_metrics(self.optimizer, self.cfg, self.compute_dtype, accum=config.accumulation),
            in_shardings=(param_sharding, opt_sharding, self.batch_sharding),
            out_shardings=(param_sharding, opt_sharding, replicated),
            donate_argnums=(0, 1),
        )

    def compile_step(self) -> tuple[float, float]:
        """Compile the step ahead of its first call, from the shapes alone (so it can run while the
        parameters are restored or made). Seconds spent tracing and lowering it (JAX's own work,
        which no cache saves), then compiling it: XLA's compile, or its executable read from the
        persistent compilation cache, which is looked up in this second stage."""
        import jax
        import numpy as np

        begin = time.perf_counter()
        tokens = jax.ShapeDtypeStruct((self.global_batch, self.cfg.seq_len + 1), np.int32, sharding=self.batch_sharding)
        with jax.set_mesh(self.mesh):  # the model's activation constraints name its axes
            lowered = self._step.lower(self._abstract, self._abstract_opt, tokens)
        lowered_at = time.perf_counter()
        self._compiled = lowered.compile()
        return lowered_at - begin, time.perf_counter() - lowered_at

    def batch(self, local_tokens):
        import jax

        return jax.make_array_from_process_local_data(self.batch_sharding, local_tokens)

    def step(self, tokens) -> float:
        import jax

        step = self._compiled if self._compiled is not None and tokens.shape == (self.global_batch, self.cfg.seq_len + 1) else self._step
        with jax.set_mesh(self.mesh):
            self.params, self.opt_state, metrics = step(self.params, self.opt_state, tokens)
        self.grad_norm = float(metrics["grad_norm"])
        return float(metrics["loss"])  # waits for the step

    def abstract(self) -> tuple[Any, Any]:
        """The parameters' and optimizer state's shapes, dtypes and shardings: where a restore
        puts each shard."""
        return self._abstract, self._abstract_opt

    def start_from(self, params: Any) -> None:
        """Fresh training from `params`: host arrays every process holds in full (placed here), or
        global arrays already in `param_sharding` (an import); a new optimizer state."""
        import jax

        if not isinstance(jax.tree.leaves(params)[0], jax.Array):
            params = jax.tree.map(_shard, params, self.param_sharding)
        self.params = params
        self.opt_state = self._init_opt(params)

    def load(self, params: Any, opt_state: Any) -> None:
        """Take restored parameters and optimizer state (already placed: see `abstract`)."""
        self.params, self.opt_state = params, opt_state

    def dense_matmul_flops(self, size: int, iters: int = 3) -> float:
        """FLOP/s of a plain [devices x size, size] @ [size, size] on the same mesh, no communication:
        what these devices do at best, the benchmark's yardstick for the training step."""
        import jax
        import jax.numpy as jnp
        import numpy as np
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        n = jax.device_count()
        x = jax.make_array_from_callback((n * size, size), self.batch_sharding, lambda idx: np.ones((size, size), np.float32)).astype(
            self.compute_dtype
        )
        w = jax.device_put(jnp.ones((size, size), self.compute_dtype), NamedSharding(self.mesh, P()))
        matmul = jax.jit(lambda a, b: a @ b, out_shardings=self.batch_sharding)
        matmul(x, w).block_until_ready()
        start = time.perf_counter()
        for _ in range(iters):
            matmul(x, w).block_until_ready()
        return 2.0 * n * size**3 * iters / (time.perf_counter() - start)


def _shard(host_array, sharding):
    """A global array from a host array every process holds in full (no compile, no transfer)."""
    import jax

    return jax.make_array_from_callback(host_array.shape, sharding, lambda index: host_array[index])
