"""The local executor: jobs run as real processes on this machine (`LocalBackend`).

Importing this package stays cheap (the worker shim is a module of it and starts on every launch), so
`LocalBackend` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.adapters.local.backend import LocalBackend

__all__ = ["LocalBackend"]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":
        from gpufleet.adapters.local.backend import LocalBackend

        return LocalBackend
    raise AttributeError(name)
