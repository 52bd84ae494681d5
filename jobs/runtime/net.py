"""Ports on this host."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this host right now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.5) -> bool:
    """Whether something accepts connections on `host:port` now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
