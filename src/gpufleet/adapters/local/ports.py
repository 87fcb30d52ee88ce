"""MASTER_PORT for each running job: unique among the jobs this backend runs, and free when handed out."""

from __future__ import annotations

import errno
import socket

from gpufleet.domain.errors import GpufleetError


class PortAllocator:
    """Hands out ports from `[low, high]`, skipping ports held by live jobs and ports a bind test shows busy.

    The search starts after the last port handed out, so a port just released (its sockets perhaps still
    in TIME_WAIT) is the last to be reused.
    """

    def __init__(self, low: int, high: int, host: str = "127.0.0.1") -> None:
        if not 1 <= low <= high <= 65535:
            raise GpufleetError(
                f"port range {low}-{high} is not a range of TCP ports", "give 1 <= low <= high <= 65535"
            )
        self.low = low
        self.high = high
        self.host = host
        self._held: dict[int, str] = {}
        self._next = low

    @property
    def held(self) -> dict[int, str]:
        """Port -> owner, for the ports handed out and not yet released."""
        return dict(self._held)

    def acquire(self, owner: str) -> int:
        size = self.high - self.low + 1
        for step in range(size):
            port = self.low + (self._next - self.low + step) % size
            if port in self._held or not self.bindable(port):
                continue
            self._held[port] = owner
            self._next = self.low + (port - self.low + 1) % size
            return port
        raise GpufleetError(
            f"no free port in {self.low}-{self.high} for MASTER_PORT ({len(self._held)} held by running jobs)",
            "widen the local executor's port range, or free ports in it",
        )

    def hold(self, port: int, owner: str) -> None:
        """Register a port a job already uses (a job adopted after a restart)."""
        self._held[port] = owner

    def release(self, port: int | None, owner: str) -> None:
        """Give the port back, if `owner` holds it (a job lost at adoption never re-registered its port)."""
        if port is not None and self._held.get(port) == owner:
            del self._held[port]

    def bindable(self, port: int) -> bool:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((self.host, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                raise
        return True
