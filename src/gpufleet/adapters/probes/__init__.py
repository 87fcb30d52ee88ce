"""GPU probes without NVML: `recorded` (replays a recording) and `emulated` (driven by jobs' declared
activity); the sample ring and its rollups; and the `Sampler` loop that feeds the ring from any probe."""

from gpufleet.adapters.probes.emulated import EmulatedProbe
from gpufleet.adapters.probes.loop import DEFAULT_INTERVAL_S, Sampler
from gpufleet.adapters.probes.recorded import RecordedProbe, Recording, load_recording
from gpufleet.adapters.probes.ring import SampleRing, UsageRollup, mean_util, util_by_job, util_by_queue

__all__ = [
    "DEFAULT_INTERVAL_S",
    "EmulatedProbe",
    "RecordedProbe",
    "Recording",
    "SampleRing",
    "Sampler",
    "UsageRollup",
    "load_recording",
    "mean_util",
    "util_by_job",
    "util_by_queue",
]
