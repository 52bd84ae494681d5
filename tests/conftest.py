"""Shared test setup: nothing here may write outside tmp dirs or the repo's build/ directory."""

import os

# Ray 2.60 writes ~/.ray/auth_token unless token auth is off; the tests never want it.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
