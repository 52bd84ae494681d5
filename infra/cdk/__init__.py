"""The cdktf side of infra: the app (`app.py`), one stack per environment (`stacks.py`) and one
construct per concern (`components/`). The only modules that import cdktf, constructs or the google
provider bindings; everything they read (the config, the node pool plans, the names) is plain Python.
"""
