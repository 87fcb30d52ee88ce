"""`SampleRing`: the last N samples of every GPU, and rollups of utilisation per GPU, job and queue.

Rollups use the allocation given (GPU -> job and queue) as it is now: a GPU's samples from before its
current job started count for that job only if the caller's window starts after the job did (the caller
knows start times; `since` is its lever).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.ports.gpu_probe import GpuOwner, GpuSample

GpuKey = tuple[str, int]
DEFAULT_RING_LENGTH = 720  # one hour at the default 5 s interval


class SampleRing:
    """A bounded history per GPU: adding past `length` samples for a GPU drops its oldest."""

    def __init__(self, length: int = DEFAULT_RING_LENGTH) -> None:
        if length < 1:
            raise ValueError(f"ring length is {length}; give 1 or more samples per GPU")
        self.length = length
        self._rings: dict[GpuKey, deque[GpuSample]] = {}

    def add(self, samples: Iterable[GpuSample]) -> None:
        for sample in samples:
            ring = self._rings.get(sample.key)
            if ring is None:
                ring = self._rings[sample.key] = deque(maxlen=self.length)
            ring.append(sample)

    def gpus(self) -> list[GpuKey]:
        return sorted(self._rings)

    def latest(self) -> list[GpuSample]:
        """The newest sample of every GPU seen, by (node, index)."""
        return [self._rings[key][-1] for key in sorted(self._rings)]

    def history(self, key: GpuKey, since: float = float("-inf"), until: float = float("inf")) -> list[GpuSample]:
        """The samples of one GPU with `since <= at <= until`, oldest first."""
        return [s for s in self._rings.get(key, ()) if since <= s.at <= until]

    def forget(self, keys: Iterable[GpuKey]) -> None:
        """Drop GPUs that left the inventory."""
        for key in keys:
            self._rings.pop(key, None)


def mean_util(ring: SampleRing, since: float = float("-inf"), until: float = float("inf")) -> dict[GpuKey, float]:
    """Mean GPU utilisation (percent) of each GPU over [since, until]; samples without a reading are skipped,
    and a GPU with no reading in the window is left out (unknown is not idle)."""
    out: dict[GpuKey, float] = {}
    for key in ring.gpus():
        values = [s.gpu_util for s in ring.history(key, since, until) if s.gpu_util is not None]
        if values:
            out[key] = sum(values) / len(values)
    return out


@dataclass(frozen=True, slots=True)
class UsageRollup:
    """Utilisation of the GPUs a job or queue holds. `gpus` counts held GPUs with a reading;
    `used_gpus` is the utilisation-weighted count (two GPUs at 50 % = 1.0); `mean_util` is percent."""

    name: str
    gpus: int
    used_gpus: float
    mean_util: float


def _rollup(gpu_util: Mapping[GpuKey, float], groups: Mapping[str, list[GpuKey]]) -> dict[str, UsageRollup]:
    out = {}
    for name, keys in sorted(groups.items()):
        values = [gpu_util[k] for k in keys if k in gpu_util]
        if values:
            used = sum(values) / 100.0
            out[name] = UsageRollup(name, len(values), used, 100.0 * used / len(values))
    return out


def util_by_job(gpu_util: Mapping[GpuKey, float], owners: Mapping[GpuKey, GpuOwner]) -> dict[str, UsageRollup]:
    """Per job: its GPUs' utilisation (from `mean_util`), by the allocation `owners`."""
    groups: dict[str, list[GpuKey]] = {}
    for key, owner in owners.items():
        groups.setdefault(owner.job, []).append(key)
    return _rollup(gpu_util, groups)


def util_by_queue(gpu_util: Mapping[GpuKey, float], owners: Mapping[GpuKey, GpuOwner]) -> dict[str, UsageRollup]:
    """Per queue: the utilisation of every GPU its jobs hold."""
    groups: dict[str, list[GpuKey]] = {}
    for key, owner in owners.items():
        groups.setdefault(owner.queue, []).append(key)
    return _rollup(gpu_util, groups)
