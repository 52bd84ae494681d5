"""Shared test setup: nothing here may write outside tmp dirs or the repo's build/ directory."""

import os

# Outside tests/jobs nothing starts a Ray cluster; this only stops a stray `ray.init()` from writing
# ~/.ray/auth_token. tests/jobs/conftest.py turns token authentication on for the test clusters.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
