"""Which Ray token this process sends: Ray's clients (`ray.init`, the Jobs API client) read
RAY_AUTH_MODE and then RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, in that order, and
Ray caches the mode and the token for the life of the process (its config and
`ray._raylet.AuthenticationTokenLoader`, Ray 2.60).
A process that talks to a second cluster (a test run, `jobs.demo` after `jobs.local up`) must drop
that cache, or it sends the first cluster's token.

The token itself only ever lives in the environment or a file the caller names: never in an
argument, a log line or a printed command.
"""

from __future__ import annotations

import os

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def use_token(*, token: str | None = None, token_path: str | None = None) -> None:
    """Send `token` (or the one in the file `token_path`) from now on."""
    if (token is None) == (token_path is None):
        raise ValueError("give exactly one of token and token_path")
    given = {"RAY_AUTH_TOKEN": token} if token is not None else {"RAY_AUTH_TOKEN_PATH": str(token_path)}
    use_environment({"RAY_AUTH_MODE": "token", **given})


def use_environment(values: dict[str, str]) -> None:
    """Apply a cluster's Ray settings (e.g. `jobs.local.ray_env`), its auth variables replacing any
    this process had, and drop the cached token."""
    for var in AUTH_VARS:
        os.environ.pop(var, None)
    os.environ.update(values)
    forget_cached_token()


def forget_cached_token() -> None:
    """Make Ray re-read RAY_AUTH_MODE (its config caches it, as Ray's own `_enable_token_auth`
    works around) and the token."""
    import importlib

    raylet = importlib.import_module("ray._raylet")
    loader = getattr(raylet, "AuthenticationTokenLoader", None)
    if loader is None:  # a Ray without token auth caches nothing
        return
    raylet.Config.initialize("")
    loader.instance().reset_cache()
