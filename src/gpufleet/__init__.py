"""gpufleet: a control plane for shared GPU fleets. `gpufleet.Client` is its Python SDK (`gpufleet.client`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpufleet.client import Client


def __getattr__(name: str) -> Any:
    # Loaded on first use: every job's shim imports this package and must stay quick to start.
    if name == "Client":
        from gpufleet.client import Client

        return Client
    raise AttributeError(f"module 'gpufleet' has no attribute {name!r}")


__all__ = ["Client", "__version__"]
