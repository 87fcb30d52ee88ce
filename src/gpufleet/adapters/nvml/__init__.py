"""NVIDIA GPUs through NVML: the choke point (`NvmlSession`), the `nvml` probe, inventory discovery and
recording. nvidia-ml-py is imported lazily, inside `NvmlSession`, so importing this package costs nothing."""

from gpufleet.adapters.nvml.discovery import discover_nodes, nvlink_groups
from gpufleet.adapters.nvml.models import short_model_name
from gpufleet.adapters.nvml.probe import NvmlProbe
from gpufleet.adapters.nvml.recording import record
from gpufleet.adapters.nvml.session import NO_NVML_FIX, NvmlSession

__all__ = [
    "NO_NVML_FIX",
    "NvmlProbe",
    "NvmlSession",
    "discover_nodes",
    "nvlink_groups",
    "record",
    "short_model_name",
]
