"""What the Prometheus collector reads on each scrape: Protocols the control plane implements, and their data.

Units are base units (seconds, bytes, whole-GPU counts), as Prometheus recommends for our own metrics.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.ports.gpu_probe import GpuOwner, GpuSample

GpuKey = tuple[str, int]

# Queue wait buckets (seconds): from "went at once" to "waited a day".
WAIT_BUCKETS_S = (10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)


@dataclass(frozen=True, slots=True)
class WaitHistogram:
    """A cumulative histogram: `buckets` are (upper bound s, jobs that waited at most that long)."""

    buckets: tuple[tuple[float, int], ...] = ()
    count: int = 0
    sum_s: float = 0.0


def wait_histogram(waits_s: Iterable[float], bounds: Sequence[float] = WAIT_BUCKETS_S) -> WaitHistogram:
    """Build the cumulative histogram of queue waits (seconds) for `QueueMetrics.wait`."""
    per_bucket = [0] * (len(bounds) + 1)
    count, total = 0, 0.0
    for wait in waits_s:
        per_bucket[bisect.bisect_left(bounds, wait)] += 1
        count += 1
        total += wait
    cumulative, running = [], 0
    for bound, n in zip(bounds, per_bucket, strict=False):
        running += n
        cumulative.append((float(bound), running))
    return WaitHistogram(tuple(cumulative), count, total)


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """One queue, now. `allocated_gpus` counts GPUs its running jobs hold (fractions as fractions);
    `used_gpus` weighs them by measured utilisation (two GPUs at 50 % = 1.0); `reserved_idle_gpus` are
    held GPUs flagged idle; `reserved_idle_gpu_seconds` and `preemptions` count since the control plane
    started (counters: they never go down)."""

    queue: str
    pending: int = 0
    running: int = 0
    wait: WaitHistogram = field(default_factory=WaitHistogram)
    allocated_gpus: float = 0.0
    used_gpus: float = 0.0
    reserved_idle_gpus: float = 0.0
    reserved_idle_gpu_seconds: float = 0.0
    preemptions: int = 0


@dataclass(frozen=True, slots=True)
class JobGpuMemory:
    """GPU memory one job's processes use on one GPU (NVML's per-process figures, summed).

    `share_bytes` is what its hold on that GPU entitles it to: the GPU memory its share reserved, else its
    fraction of the GPU's memory; 0 when it holds no share of this GPU at all (a process that reached a GPU
    it was not given). `over_share`: it uses more than that, which a fractional share cannot prevent (the
    GPU does not enforce it: the job must cooperate)."""

    job: str
    queue: str
    node: str
    index: int
    uuid: str
    used_bytes: int
    share_bytes: int
    pids: tuple[int, ...] = ()

    @property
    def over_share(self) -> bool:
        return self.used_bytes > self.share_bytes


@dataclass(frozen=True, slots=True)
class UnattributedMemory:
    """GPU memory on one GPU used by processes that belong to no gpufleet job (the GPU is used outside the
    scheduler)."""

    node: str
    index: int
    uuid: str
    used_bytes: int = 0
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CostCounter:
    """USD of GPU time a queue's jobs held on one GPU model in one pool, since the control plane started."""

    queue: str
    model: str
    pool: str
    usd: float


@dataclass(frozen=True, slots=True)
class BudgetGauge:
    """A queue's budget: the share spent in its window, and its level (0 ok, 1 notice, 2 exceeded)."""

    queue: str
    ratio: float
    level: int


@dataclass(frozen=True, slots=True)
class SpotPoolGauge:
    """A spot pool's circuit breaker (0 closed, 1 half-open, 2 open), its interruption rate per node-hour over
    the window, and its interruptions since the control plane started."""

    pool: str
    state: int
    rate_per_node_hour: float
    interruptions: int


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """One consistent read of the scheduler for a scrape. `owners` labels each GPU's samples with its job
    and queue. `fragmentation_ratio` is FGD's share of the idle GPU capacity that is fragmented (0..1) and
    `fragmented_gpus` the same in GPUs; `cycle_*` describe scheduling cycles since start.

    `processes_attributed` says whether GPU processes were mapped to jobs at all (False: no executor to ask,
    and the per-process families are left empty rather than call every process unattributed). Then
    `job_memory` lists each job's memory per GPU and `unattributed` every sampled GPU (used 0 when clean)."""

    queues: tuple[QueueMetrics, ...] = ()
    owners: Mapping[GpuKey, GpuOwner] = field(default_factory=dict)
    fragmentation_ratio: float | None = None
    fragmented_gpus: float | None = None
    cycles: int = 0
    cycle_seconds_sum: float = 0.0
    last_cycle_seconds: float | None = None
    processes_attributed: bool = False
    job_memory: tuple[JobGpuMemory, ...] = ()
    unattributed: tuple[UnattributedMemory, ...] = ()
    costs: tuple[CostCounter, ...] = ()
    budgets: tuple[BudgetGauge, ...] = ()
    spot_pools: tuple[SpotPoolGauge, ...] = ()


class SchedulerView(Protocol):
    def scheduler_state(self) -> SchedulerState:
        """Called once per scrape; must be cheap (a read of in-memory state) and must not block the loop."""
        ...


class SampleSource(Protocol):
    def latest_samples(self) -> Sequence[GpuSample]:
        """The newest sample of every GPU (e.g. `SampleRing.latest` or `Sampler.latest_samples`)."""
        ...
