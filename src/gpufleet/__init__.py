"""gpufleet: a control plane for shared GPU fleets."""

__version__ = "0.1.0"
