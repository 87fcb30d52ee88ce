"""The `emulated` probe: plausible GPU readings for an emulated inventory, driven by what jobs declare.

No GPU is read: every value is made up from the job's declared activity (`GpuActivity`) and the GPU
model's datasheet figures, with seeded noise, so a run is reproducible (same seed, same calls, same
values). Every sample is exported with `probe="emulated"`.

Levels: no job -> 0 % and idle power; `idle` (holds the GPU, runs nothing) -> 0-2 %; `light` -> 20-50 %;
`busy` -> 85-99 %. Utilisation scales with the job's share of the GPU (`milli`). Memory used is what the
job declares, else its share of the GPU's memory (90 % of it: frameworks cache what they can).

The sample's `processes` are the activity's `pids` (the control plane gives the real pids of the jobs'
workers, so the pid-to-job mapping runs on emulated inventories too). The memory is split among them in
proportion to each pid's weight from `pid_weights` (the milli-GPU share of the job it belongs to: two jobs
of 300 and 700 on one GPU use 30 % and 70 % of it), evenly when no weights are given.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpufleet.domain.cluster import Node
from gpufleet.ports.gpu_probe import ActivityLevel, GpuActivity, GpuSample

GpuKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class _ModelFigures:
    power_limit_w: float
    idle_power_w: float
    max_sm_clock_mhz: float


# Datasheet TDPs and boost clocks; idle power as commonly seen on these boards.
_FIGURES = {
    "A100": _ModelFigures(400.0, 55.0, 1410.0),
    "H100": _ModelFigures(700.0, 70.0, 1980.0),
    "H200": _ModelFigures(700.0, 75.0, 1980.0),
    "B200": _ModelFigures(1000.0, 120.0, 1965.0),
    "V100": _ModelFigures(300.0, 40.0, 1530.0),
    "T4": _ModelFigures(70.0, 10.0, 1590.0),
    "L4": _ModelFigures(72.0, 12.0, 2040.0),
    "L40S": _ModelFigures(350.0, 35.0, 2520.0),
    "A10G": _ModelFigures(300.0, 25.0, 1710.0),
}
_DEFAULT = _ModelFigures(300.0, 40.0, 1500.0)
_IDLE_CLOCK_MHZ = 210.0
# (low, high) GPU utilisation percent per level, for a whole GPU.
_UTIL = {ActivityLevel.IDLE: (0.0, 2.0), ActivityLevel.LIGHT: (20.0, 50.0), ActivityLevel.BUSY: (85.0, 99.0)}
_MEM_UTIL_PER_UTIL = {ActivityLevel.IDLE: 0.0, ActivityLevel.LIGHT: 0.3, ActivityLevel.BUSY: 0.55}
_PCIE_BUSY_BPS = 2.0e9  # host<->device traffic of a busy training job, both ways
_NVLINK_BUSY_BPS = 40.0e9  # all-reduce traffic of a busy multi-GPU job


def figures(model: str) -> _ModelFigures:
    """Datasheet figures of a short model name ("A100-80GB" -> A100's)."""
    return _FIGURES.get(model.split("-", maxsplit=1)[0].upper(), _DEFAULT)


class EmulatedProbe:
    """Samples `nodes`' GPUs; `activity()` says, at each sample, which job is on which (node, GPU index)."""

    kind = "emulated"

    def __init__(
        self,
        nodes: Sequence[Node],
        activity: Callable[[], Mapping[GpuKey, GpuActivity]],
        *,
        seed: int = 0,
        pid_weights: Callable[[], Mapping[int, int]] | None = None,
    ) -> None:
        self.nodes = tuple(nodes)
        self.activity = activity
        self.pid_weights = pid_weights
        self._gpus = [(node.name, gpu) for node in self.nodes for gpu in node.gpus]
        self._figures = [figures(gpu.model) for _, gpu in self._gpus]
        self._rng = np.random.default_rng(seed)
        # A stable per-GPU temperature offset (boards differ by a few degrees), fixed by the seed and the UUID.
        self._temp_offset = [(zlib.crc32(gpu.uuid.encode()) ^ seed) % 7 for _, gpu in self._gpus]

    def sample(self, now: float) -> Sequence[GpuSample]:
        acts = self.activity()
        weights = self.pid_weights() if self.pid_weights is not None else {}
        n = len(self._gpus)
        noise = self._rng.random((5, n))  # one draw per call: determinism does not depend on activity
        out = []
        for i, (node, gpu) in enumerate(self._gpus):
            act = acts.get((node, gpu.index))
            fig = self._figures[i]
            processes: tuple[tuple[int, int], ...] = ()
            if act is None:
                util, mem_util, used, frac = 0.0, 0.0, 0, 0.0
            else:
                share = min(max(act.milli, 0), 1000) / 1000.0
                low, high = _UTIL[act.level]
                util = round((low + (high - low) * noise[0, i]) * share, 1)
                mem_util = round(util * _MEM_UTIL_PER_UTIL[act.level] * (0.8 + 0.4 * noise[1, i]), 1)
                declared = act.memory if act.memory > 0 else int(0.9 * share * gpu.memory)
                used = min(gpu.memory, int(declared * (0.99 + 0.02 * noise[2, i])))
                frac = util / 100.0
                processes = _split(used, act.pids, weights)
            power = fig.idle_power_w + (fig.power_limit_w - fig.idle_power_w) * frac * (0.85 + 0.1 * noise[3, i])
            clock = fig.max_sm_clock_mhz if act is not None and act.level is not ActivityLevel.IDLE else _IDLE_CLOCK_MHZ
            out.append(
                GpuSample(
                    node=node,
                    index=gpu.index,
                    uuid=gpu.uuid,
                    model=gpu.model,
                    model_name=f"emulated {gpu.model}",
                    at=now,
                    probe=self.kind,
                    gpu_util=util,
                    mem_util=mem_util,
                    memory_used=used,
                    memory_free=gpu.memory - used,
                    memory_total=gpu.memory,
                    power_w=round(power, 1),
                    power_limit_w=fig.power_limit_w,
                    temperature_c=float(round(30 + self._temp_offset[i] + 45 * frac + 2 * noise[4, i])),
                    sm_clock_mhz=clock,
                    ecc_sbe=0,
                    ecc_dbe=0,
                    xid=0,  # as DCGM: 0 = no XID error seen
                    pcie_tx=round(_PCIE_BUSY_BPS * frac * noise[1, i]),
                    pcie_rx=round(_PCIE_BUSY_BPS * frac * noise[2, i]),
                    nvlink_tx=round(_NVLINK_BUSY_BPS * frac * noise[3, i]),
                    nvlink_rx=round(_NVLINK_BUSY_BPS * frac * noise[4, i]),
                    processes=processes,
                )
            )
        return out


def _split(used: int, pids: Sequence[int], weights: Mapping[int, int]) -> tuple[tuple[int, int], ...]:
    """`used` bytes shared among `pids` in proportion to their weights (1 each when not given)."""
    if not pids:
        return ()
    parts = [max(1, weights.get(pid, 1)) for pid in pids] if weights else [1] * len(pids)
    total = sum(parts)
    return tuple((pid, used * part // total) for pid, part in zip(pids, parts, strict=True))
