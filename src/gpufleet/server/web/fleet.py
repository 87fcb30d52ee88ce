"""What the Overview, Queues and Nodes pages show, computed from the service's answers and the telemetry's
published state (never from the store directly, never with rules of their own)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.adapters.metrics import WaitHistogram
from gpufleet.domain.quotas import CPU, GPU, GPU_MODEL_PREFIX, MEMORY
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.policies.order.fair_share import weighted_dominant_share
from gpufleet.server.auth import Principal
from gpufleet.server.gpu_monitor import FleetPoint, Telemetry
from gpufleet.server.http_errors import NotFoundError
from gpufleet.server.schemas import GpuNowOut, NodeOut, QueueOut, QuotaOut, TelemetryOut
from gpufleet.server.service import Service


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile of values (linear between order statistics); None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def histogram_quantile(histogram: WaitHistogram, q: float) -> tuple[float | None, bool]:
    """The upper bound of the bucket the q-quantile of a cumulative histogram falls in (the quantile is at
    most that), or, with `True`, the last bound when it lies beyond (the quantile is more than that). Bucket
    bounds, not interpolation: with a few coarse buckets an interpolated figure would look measured."""
    if histogram.count == 0 or not histogram.buckets:
        return None, False
    target = q * histogram.count
    for bound, cumulative in histogram.buckets:
        if cumulative >= target:
            return bound, False
    return histogram.buckets[-1][0], True


@dataclass(frozen=True)
class QueueNow:
    queue: str
    pending: int
    running: int
    oldest_wait_s: float | None
    p95_waiting_s: float | None  # of the jobs waiting now, so far
    p95_start_wait_s: float | None  # of the jobs started since the control plane started
    p95_start_wait_floor: bool
    started: int
    allocated: float
    used: float
    reserved_idle: float
    preemptions: int


@dataclass(frozen=True)
class NodeHealth:
    name: str
    healthy: bool
    cordoned: bool
    gpus: int
    allocated: float


@dataclass(frozen=True)
class Overview:
    capacity: int
    allocated: float
    used: float | None
    reserved_idle: float | None
    fragmentation_ratio: float | None
    fragmented_gpus: float | None
    pending: int
    running: int
    preemptions: int
    queues: list[QueueNow]
    nodes: list[NodeHealth]
    history: list[FleetPoint]
    telemetry: TelemetryOut | None
    probe: str | None

    @property
    def free(self) -> float:
        return max(0.0, self.capacity - self.allocated)

    def series(self) -> dict[str, list[float]]:
        """The chart's columns: time, then GPUs allocated, used, reserved-idle and free per tick."""
        return {
            "t": [p.at for p in self.history],
            "allocated": [round(p.allocated, 3) for p in self.history],
            "used": [round(p.used, 3) for p in self.history],
            "reserved_idle": [round(p.reserved_idle, 3) for p in self.history],
            "free": [round(p.free, 3) for p in self.history],
        }


def telemetry_of(svc: Service) -> Telemetry | None:
    try:
        return svc.gpu_telemetry()
    except NotFoundError:
        return None


def overview(svc: Service, principal: Principal) -> Overview:
    nodes = svc.nodes()
    health = [
        NodeHealth(n.name, n.healthy, n.cordoned, len(n.gpus), sum(min(1.0, g.allocated) for g in n.gpus))
        for n in nodes
    ]
    capacity = sum(h.gpus for h in health)
    allocated = sum(h.allocated for h in health)
    tel = telemetry_of(svc)
    if tel is None:
        # No telemetry (an API without `up`): what the store says is held, nothing measured.
        queues = [
            QueueNow(q.name, q.usage.pending, q.usage.running, None, None, None, False, 0, q.usage.gpus, 0.0, 0.0, 0)
            for q in svc.queues(principal)
        ]
        return Overview(
            capacity, allocated, None, None, None, None, sum(q.pending for q in queues),
            sum(q.running for q in queues), 0, queues, health, [], None, None,
        )  # fmt: skip
    now_out = svc.telemetry(principal)
    observer = tel.observer
    now = svc.ctx.clock.now()
    waiting: dict[str, list[float]] = {}
    for job in observer.view.pending.values():
        waiting.setdefault(job.queue, []).append(max(0.0, now - job.submitted_at))
    queues = []
    for q in now_out.queues:
        histogram = observer.wait_histogram(q.queue)
        p95_start, floor = histogram_quantile(histogram, 0.95)
        queues.append(
            QueueNow(
                queue=q.queue,
                pending=q.pending,
                running=q.running,
                oldest_wait_s=q.oldest_wait_s,
                p95_waiting_s=quantile(waiting.get(q.queue, []), 0.95),
                p95_start_wait_s=p95_start,
                p95_start_wait_floor=floor,
                started=histogram.count,
                allocated=q.allocated_gpus,
                used=q.used_gpus,
                reserved_idle=q.reserved_idle_gpus,
                preemptions=observer.preemptions.get(q.queue, 0),
            )
        )
    history = list(tel.history)
    last = history[-1] if history else None
    fragmentation = tel.state.fragmentation
    return Overview(
        capacity=capacity,
        allocated=allocated,
        used=last.used if last else None,
        reserved_idle=last.reserved_idle if last else None,
        fragmentation_ratio=fragmentation[0] if fragmentation else None,
        fragmented_gpus=fragmentation[1] if fragmentation else None,
        pending=sum(q.pending for q in queues),
        running=sum(q.running for q in queues),
        preemptions=sum(q.preemptions for q in queues),
        queues=queues,
        nodes=health,
        history=history,
        telemetry=now_out,
        probe=now_out.probe,
    )


# ------------------------------------------------------------------------------------------------ queues


@dataclass(frozen=True)
class QuotaRow:
    resource: str  # gpu, gpu:<model>, cpu, memory
    unit: str
    nominal: float | None
    borrowing_limit: float | None
    lending_limit: float | None
    used: float

    @property
    def borrowed(self) -> float:
        """What the queue uses beyond its nominal quota now (borrowed from its cohort)."""
        return max(0.0, self.used - (self.nominal or 0.0)) if self.nominal is not None else 0.0


@dataclass(frozen=True)
class QueueView:
    queue: QueueOut
    rows: list[QuotaRow]
    weight_share: float  # its weight over all queues' weights: what fair share entitles it to
    dominant_share: float  # the fair-share order's measure now: largest share of the fleet, over the weight
    models: list[str] = field(default_factory=list)


def queue_views(svc: Service, principal: Principal) -> list[QueueView]:
    shown = svc.queues(principal)
    every = {q.name: q for q in svc.store.queues()}  # weights of all queues: entitlement is relative to them
    nodes = svc.store.nodes()
    capacity = {
        GPU: sum(len(n.gpus) for n in nodes) * MILLI_PER_GPU,
        CPU: sum(n.cpu_milli for n in nodes),
        MEMORY: sum(n.memory for n in nodes),
    }
    total_weight = sum(q.weight for q in every.values()) or 1.0
    views = []
    for q in shown:
        use = q.usage
        used_base = {GPU: round(use.gpus * MILLI_PER_GPU), CPU: round(use.cpu * 1000), MEMORY: use.memory}
        rows = []
        keys = sorted(set(q.quotas) | {GPU_MODEL_PREFIX + m for m in use.gpus_by_model} | {GPU})
        for key in keys:
            quota = q.quotas.get(key, QuotaOut(nominal=None, borrowing_limit=None, lending_limit=None))
            if key == GPU:
                used = use.gpus
            elif key == CPU:
                used = use.cpu
            elif key == MEMORY:
                used = float(use.memory)
            else:
                used = use.gpus_by_model.get(key.removeprefix(GPU_MODEL_PREFIX), 0.0)
            unit = "cores" if key == CPU else "bytes" if key == MEMORY else "GPUs"
            rows.append(QuotaRow(key, unit, quota.nominal, quota.borrowing_limit, quota.lending_limit, used))
        views.append(
            QueueView(
                queue=q,
                rows=rows,
                weight_share=q.weight / total_weight,
                dominant_share=weighted_dominant_share(used_base, capacity, q.weight),
                models=sorted(use.gpus_by_model),
            )
        )
    return views


# ------------------------------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class GpuCell:
    node: NodeOut
    index: int
    model: str
    memory_total: int
    allocated: float
    jobs: list[tuple[str, str, float]]  # (job id, queue, fraction)
    sample: GpuNowOut | None

    @property
    def idle(self) -> bool:
        return self.sample is not None and self.sample.idle


def gpu_grid(nodes: list[NodeOut], telemetry: TelemetryOut | None) -> dict[str, list[GpuCell]]:
    samples = {(g.node, g.index): g for g in telemetry.gpus} if telemetry is not None else {}
    return {
        node.name: [
            GpuCell(
                node,
                gpu.index,
                gpu.model,
                gpu.memory,
                gpu.allocated,
                [(a.job_id, a.queue, a.fraction) for a in gpu.jobs],
                samples.get((node.name, gpu.index)),
            )
            for gpu in node.gpus
        ]
        for node in nodes
    }
