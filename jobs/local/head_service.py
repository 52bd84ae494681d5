"""The head's Service in front of the simulated dashboard: a TCP forwarder on 127.0.0.1, through which
a RayJob's submitter reaches the head as it does through `<rayjob>-head-svc` on GKE. `drop()` resets
every connection through it at once, as a network blip between the submitter's pod and the head
does (`python -m jobs.local rayjob` calls it on SIGUSR2): the submitter's log stream breaks while
the job runs on."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from jobs.runtime.net import free_port

BUFFER = 65536


class HeadService:
    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.drops = 0
        threading.Thread(target=self._accept, daemon=True, name="head-service").start()

    @property
    def address(self) -> str:
        """host:port, as KubeRay sets RAY_DASHBOARD_ADDRESS."""
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the dashboard is not there: the client sees a refused-like close
                continue
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(BUFFER):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                self._close(s)

    def _close(self, s: socket.socket, reset: bool = False) -> None:
        with self._lock:
            self._open.discard(s)
        with contextlib.suppress(OSError):
            if reset:  # RST, not FIN: the peer sees the connection broken, not ended
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # Wakes the pipe thread blocked in recv(); SHUT_RD sends nothing, so close() sends the RST.
            s.shutdown(socket.SHUT_RD if reset else socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()

    def drop(self) -> int:
        """Reset every open connection; how many there were."""
        with self._lock:
            open_now = list(self._open)
        for s in open_now:
            self._close(s, reset=True)
        self.drops += 1
        return len(open_now) // 2

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop()
