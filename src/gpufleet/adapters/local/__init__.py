"""The local executor: jobs run as real processes on this machine (`LocalBackend`, `executor.py`).

Its parts a node agent of a multi-node backend reuses: `supervisor.py` (one node's workers: start, watch,
signal, kill, adopt, logs) and `isolation.py` (how a worker starts: user, environment, cgroup, devices).

Importing this package stays cheap (the worker shim is a module of it and starts on every launch), so
`LocalBackend` is loaded on first use and `typing` is not imported at run time.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpufleet.adapters.local.executor import LocalBackend

__all__ = ["LocalBackend"]


def __getattr__(name: str) -> type[LocalBackend]:
    if name == "LocalBackend":
        from gpufleet.adapters.local.executor import LocalBackend

        return LocalBackend
    raise AttributeError(name)
