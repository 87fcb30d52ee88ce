"""GPU telemetry port: what a probe reports about each GPU, and what the emulated probe is told about jobs.

Three probes implement `GpuProbe`: `nvml` (the real GPUs of this machine, through NVIDIA's NVML),
`recorded` (replays a recording of samples) and `emulated` (plausible values for an emulated inventory,
driven by what the jobs on each GPU declare). Every sample says which probe made it (`GpuProbe.kind`), and so
does every sample (`GpuSample.probe`): no emulated number is ever shown as a measured one.

Units are base units except where NVML's own unit is the only natural one: percent for utilisation,
watts, degrees Celsius, MHz. Memory is in bytes, throughput in bytes per second. A field a probe could not
read is `None` (not 0): "unknown" and "zero" mean different things to reclaim decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU at time `at` (seconds on the caller's clock).

    `model` is the short name the scheduler uses ("A100-80GB"); `model_name` the name NVML reports
    ("NVIDIA A100-SXM4-80GB"), kept for dashboards that group by it. `processes` lists (pid, GPU memory
    in bytes) of the compute processes on the GPU. `xid` is the last XID error seen since the probe
    started (None: none seen, or not readable). ECC counts are volatile (since the last driver load).
    """

    node: str
    index: int
    uuid: str
    model: str
    at: float = 0.0
    model_name: str = ""
    probe: str = ""  # the kind of probe that made it: "nvml", "recorded" or "emulated"
    gpu_util: float | None = None  # percent of the sample period a kernel ran
    mem_util: float | None = None  # percent of the sample period memory was read or written
    memory_used: int | None = None  # bytes
    memory_free: int | None = None  # bytes
    memory_total: int | None = None  # bytes
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    ecc_sbe: int | None = None  # corrected (single-bit) errors
    ecc_dbe: int | None = None  # uncorrected (double-bit) errors
    xid: int | None = None
    pcie_tx: float | None = None  # bytes/s
    pcie_rx: float | None = None  # bytes/s
    nvlink_tx: float | None = None  # bytes/s, all links
    nvlink_rx: float | None = None  # bytes/s, all links
    processes: tuple[tuple[int, int], ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        """(node, GPU index): how rings, allocations and activity maps name a GPU."""
        return (self.node, self.index)


class GpuProbe(Protocol):
    """Reads the GPUs it knows about. `sample` never raises for a field it cannot read: that field is None."""

    kind: str  # "nvml" | "recorded" | "emulated"

    def sample(self, now: float) -> Sequence[GpuSample]:
        """One sample per GPU, each stamped `at=now`. Cheap enough to call every few seconds."""
        ...


class ActivityLevel(enum.StrEnum):
    """What a job says it does with its GPUs; drives the emulated probe only."""

    IDLE = "idle"  # holds the GPU, runs nothing (a notebook left open): ~0-2 % utilisation
    LIGHT = "light"  # data loading bound, small kernels: ~20-50 %
    BUSY = "busy"  # training step after step: ~85-99 %


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """What the emulated probe is told about the job on one GPU.

    `milli` is the job's share of the GPU (1000 = whole); utilisation scales with it. `memory` is the GPU
    memory the job holds in bytes (0: a share of the GPU's memory in proportion to `milli`). `pids` are
    the job's processes on the GPU, reported in the sample's `processes` with the memory split evenly.
    """

    job: str
    level: ActivityLevel = ActivityLevel.BUSY
    milli: int = 1000
    memory: int = 0
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuOwner:
    """Who holds a GPU: the job and its queue. Telemetry uses it to label and roll up samples."""

    job: str
    queue: str
