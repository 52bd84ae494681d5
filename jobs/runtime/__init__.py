"""What runs on the Ray cluster, under every workload: no argparse, no printing.

labels (the one reader of `ray.io/tpu-*` node labels) -> inventory (what slices there are) ->
reservation (whole slices, atomically) -> launch (one JAX process per host) -> outcomes (what a
failure means) -> reruns (whole-slice reruns within budgets); progress and deadlines bound every wait.
"""
