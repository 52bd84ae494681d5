"""cdktf constructs, one concern each, composed by `infra.cdk.stacks.RayTpuStack`.

Importing this package loads the google provider bindings (~20 s, ~0.5 GB): only synth does.
"""
