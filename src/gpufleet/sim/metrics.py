"""What a simulated run measured: job times, cluster use, fragmentation, cost and fairness, per policy.

Everything here is a pure function of a finished run (`SimRun`: the store's records and transition log, the
backend's counters, the per-step samples) and, optionally, of a `Recording` (what a `Recorder` observer saw
of the node table during the run). Same run, same numbers. Definitions (seconds unless said otherwise):

- **JCT** (job completion time) = `finished_at - submitted_at`, over jobs that finished (succeeded or failed).
- **Queueing delay** = `first_started_at - submitted_at` (first launch), over jobs that started at least once.
- **Pending time** = all time a job spent in state `pending` (before its first launch and after each
  preemption or loss), from the transition log; jobs still pending at the end count until the end.
- **Slowdown** = JCT / the job's trace run time (reference speed), over finished jobs with a run time.
- **Makespan** = last finish (or the run's end, if some jobs never finished) - first arrival.
- **GPU allocation %** = time-weighted mean over the makespan of allocated milli-GPU / capacity, each step's
  sample held until the next step (when nodes join during the run: allocated over installed capacity, both
  integrated over time; nodes that are down still count as capacity); **GPU-hours allocated** is the same
  integral (reserved, launching and evicting GPUs count: they are not free for anyone else). Per GPU model
  it needs a `Recording`.
- **Fragmentation**: FGD's measure (`gpufleet.scheduling.fragmentation`, Weng et al., ATC'23) of the node table,
  with the run's own workload as the target workload (`TargetWorkload.from_requests`, as the paper does). It is
  sampled by the `Recorder` (at regular times, or at each 5 % step of arrived load in the FGD protocol) and
  summarised as the time-weighted mean of the samples: `fragmentation_pct_of_capacity` (fragmented milli-GPU
  / capacity) and `fragmentation_ratio_pct_of_idle` (fragmented / idle).
- **Preemptions** from the records; **work lost** (seconds of progress at reference speed, and GPU-hours) and
  **restart penalty** GPU-hours from the simulated backend's counters; `lost_*` covers preemptions and node
  failures together.
- **Node failures** (`gpufleet.sim.events`): `node_failures` = times a healthy node went down;
  `jobs_lost_to_failures` = job attempts running on a node when it went down (each goes back to its queue);
  `failure_lost_work_s` / `failure_lost_gpu_hours` = the work those attempts lost (since their last periodic
  checkpoint); `node_down_gpu_hours` = GPUs x hours that nodes were down; `cluster_events` = cluster changes
  applied (failures, repairs, quota changes, nodes added).
- **Cost** = GPU-hours allocated per model x the price table's USD per GPU-hour for that model; models the
  table does not price are listed in `unpriced_models` and left out of `cost_usd`.
- **Jain's fairness index** J(x) = (sum x)^2 / (n sum x^2), 1 = equal, 1/n = one queue takes all, over queues:
  `jain_slowdown` of each queue's mean slowdown (queues with a finished job; equal slowdown = fair), and
  `jain_gpu_share` of each queue's GPU-seconds received divided by its weight (queues that submitted a job;
  this ignores demand: a queue that asked for little scores low).
- **Finish-time fairness rho** (Themis, NSDI'20; as Gavel reports it) = JCT / T_isolated, where T_isolated is
  the job's run time on a 1/N share of the cluster. Approximation: N = time-weighted mean number of jobs in
  the system (pending + running, from the samples) during the job's life; a 1/N share is C/N GPUs of the C
  in the cluster (quotas and VC partitions are ignored); a job of g GPUs at reference speed takes
  `T_isolated = duration x max(1, g N / C)` (it cannot go faster than its own size; on less than g GPUs it is
  slowed in proportion). With a throughput table (a heterogeneous cluster, as Gavel's), an equal share is an
  equal time on every GPU of the cluster, so `duration` (given at the reference model's speed) is divided by
  the job's mean relative speed over the cluster's GPUs (Gavel's isolated share). rho > 1: the job did worse
  than on its fair share (`ftf_unfair_pct`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gpufleet.control.reconciler import Reconciler
from gpufleet.domain.errors import WorkloadError
from gpufleet.domain.jobs import Job
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.records import JobRecord
from gpufleet.domain.throughput_table import job_scale
from gpufleet.scheduling.fragmentation import TargetWorkload, cluster_fragmentation
from gpufleet.scheduling.table import NodeTable
from gpufleet.sim.engine import Sample, SimRun
from gpufleet.sim.prices import PriceTable
from gpufleet.sim.workload import Workload

FloatArray = npt.NDArray[np.float64]

FGD_STEP_PCT = 5
STATS = ("avg", "p50", "p95", "p99", "max")
DEFAULT_FRAG_SAMPLES = 200  # regular fragmentation samples over the arrival span (outside the FGD protocol)


# --- small statistics ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """Mean, median, tail percentiles (linear interpolation) and maximum of some values; None when empty."""

    count: int
    avg: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Summary:
        array = np.fromiter(values, dtype=np.float64)
        if not array.size:
            return cls(0, None, None, None, None, None)
        p50, p95, p99 = (float(v) for v in np.percentile(array, [50, 95, 99]))
        return cls(int(array.size), float(array.mean()), p50, p95, p99, float(array.max()))

    def flat(self, name: str, unit: str = "") -> dict[str, float | None]:
        """`{avg_<name><unit>: …, p50_<name><unit>: …}`: e.g. avg_jct_s, p95_jct_s."""
        return {f"{stat}_{name}{unit}": _round(getattr(self, stat)) for stat in STATS}


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index of non-negative values: 1 when all are equal, 1/n when one has everything."""
    array = np.asarray(values, dtype=np.float64)
    if not array.size:
        return None
    squares = float((array * array).sum())
    if squares == 0.0:
        return 1.0
    return float(array.sum()) ** 2 / (array.size * squares)


def time_average(times: Sequence[float] | FloatArray, values: Sequence[float] | FloatArray, end: float) -> float:
    """Mean over [times[0], end] of the step function that holds values[i] from times[i] to times[i + 1]."""
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if not t.size:
        return 0.0
    span = end - float(t[0])
    if span <= 0:
        return float(v[-1])
    widths = np.diff(np.append(t, max(end, float(t[-1]))))
    return float((v * widths).sum() / span)


def _integral(times: FloatArray, values: FloatArray, end: float) -> float:
    """Integral over [times[0], end] of the same step function."""
    if not times.size:
        return 0.0
    widths = np.diff(np.append(times, max(end, float(times[-1]))))
    return float((values * widths).sum())


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


# --- what the recorder sees during a run ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FragSample:
    """FGD fragmentation of the cluster at one time, in milli-GPU."""

    at: float
    fragmented_milli: float
    idle_milli: int
    capacity_milli: int


@dataclass(frozen=True, slots=True)
class FgdStep:
    """The FGD protocol's measurement at one step of arrived load (cumulative requested GPU / capacity).

    Taken after the first arrival that brings the arrived load to `arrived_pct` % or more (`arrived_pct` 0:
    after the first arrival); `arrived_gpu_pct` is the exact arrived load there.
    """

    arrived_pct: int
    arrived_gpu_pct: float
    at: float
    gpu_alloc_pct: float
    frag_gpu_pct_of_capacity: float
    frag_ratio_pct_of_idle: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "arrived_pct": self.arrived_pct,
            "arrived_gpu_pct": round(self.arrived_gpu_pct, 4),
            "gpu_alloc_pct": round(self.gpu_alloc_pct, 4),
            "frag_gpu_pct_of_capacity": round(self.frag_gpu_pct_of_capacity, 4),
            "frag_ratio_pct_of_idle": round(self.frag_ratio_pct_of_idle, 4),
        }


@dataclass(frozen=True)
class Recording:
    """What a `Recorder` saw: allocated milli-GPU per GPU model after every step, fragmentation samples, and
    (FGD protocol) the measurement at each 5 % step of arrived load."""

    models: tuple[str, ...]
    times: FloatArray
    allocated_milli: npt.NDArray[np.int64]  # [steps, models]
    frag: tuple[FragSample, ...] = ()
    fgd_steps: tuple[FgdStep, ...] = ()


class Recorder:
    """An `observer` for `Simulation`: called with (now, reconciler) after every step.

    `fgd_protocol`: measure GPU allocation and fragmentation at each `FGD_STEP_PCT` % step of arrived load
    (and take the fragmentation samples there); otherwise fragmentation is sampled every `frag_every_s`
    simulated seconds (default: the arrival span / 200).
    """

    def __init__(self, workload: Workload, *, fgd_protocol: bool = False, frag_every_s: float | None = None) -> None:
        self.workload = workload
        self.fgd_protocol = fgd_protocol
        self.capacity = workload.gpu_capacity_milli
        requests = [tj.job.request for tj in workload.jobs]
        self.target = TargetWorkload.from_requests(requests) if requests else None
        arrivals = np.array([tj.arrival for tj in workload.jobs], dtype=np.float64)
        self._arrivals = arrivals
        self._arrived_milli = np.cumsum([tj.gpu_milli_total for tj in workload.jobs], dtype=np.int64)
        span = float(arrivals[-1] - arrivals[0]) if arrivals.size else 0.0
        self.frag_every_s = frag_every_s if frag_every_s is not None else max(1.0, span / DEFAULT_FRAG_SAMPLES)
        self._next_frag = -math.inf
        self._next_step = 0
        self._table: NodeTable | None = None
        self._slots = np.zeros(0, dtype=np.int64)
        self._slot_model = np.zeros(0, dtype=np.int64)
        self._columns: dict[str, int] = {}  # GPU model -> column of the allocation rows, in order of appearance
        self._times: list[float] = []
        self._allocated: list[npt.NDArray[np.int64]] = []
        self._frag: list[FragSample] = []
        self._steps: list[FgdStep] = []

    def _bind(self, table: NodeTable) -> None:
        # A new table (the cluster changed): map its GPU slots to the recording's model columns, adding
        # columns for models that joined (nodes added during the run).
        self._table = table
        exists = table.gpu_exists.ravel()
        self._slots = np.flatnonzero(exists)
        for model in table.models:
            self._columns.setdefault(model, len(self._columns))
        column_of = np.array([self._columns[m] for m in table.models], dtype=np.int64)
        self._slot_model = column_of[table.gpu_model.ravel()[self._slots]] if column_of.size else self._slot_model[:0]

    def __call__(self, now: float, reconciler: Reconciler) -> None:
        table = reconciler.base.table
        if table is not self._table:
            self._bind(table)
        free = table.gpu_milli_free.ravel()[self._slots]
        used = np.bincount(self._slot_model, weights=1000 - free, minlength=len(self._columns)).astype(np.int64)
        self._times.append(now)
        self._allocated.append(used)
        if self.fgd_protocol:
            self._fgd(now, table, int(used.sum()))
        elif now >= self._next_frag:
            self._sample_frag(now, table)
            self._next_frag = (math.floor(now / self.frag_every_s) + 1) * self.frag_every_s

    def _sample_frag(self, now: float, table: NodeTable) -> FragSample | None:
        if self.target is None or not len(table):
            return None
        summary = cluster_fragmentation(table, self.target)
        sample = FragSample(now, summary.fragmented_milli, summary.idle_milli, summary.capacity_milli)
        self._frag.append(sample)
        return sample

    def _fgd(self, now: float, table: NodeTable, allocated: int) -> None:
        arrived = int(np.searchsorted(self._arrivals, now, side="right"))
        if not arrived or not self.capacity:
            return
        arrived_pct = 100.0 * float(self._arrived_milli[arrived - 1]) / self.capacity
        sample = None
        while self._next_step * FGD_STEP_PCT <= arrived_pct + 1e-9:
            sample = sample or self._sample_frag(now, table)
            if sample is None:
                return
            idle = sample.idle_milli
            self._steps.append(
                FgdStep(
                    self._next_step * FGD_STEP_PCT,
                    arrived_pct,
                    now,
                    100.0 * allocated / self.capacity,
                    100.0 * sample.fragmented_milli / self.capacity,
                    100.0 * sample.fragmented_milli / idle if idle else 0.0,
                )
            )
            self._next_step += 1

    def recording(self) -> Recording:
        models = tuple(sorted(self._columns))
        width = len(self._columns)
        allocated = np.zeros((len(self._allocated), width), dtype=np.int64)
        for i, row in enumerate(self._allocated):
            allocated[i, : row.size] = row
        order = [self._columns[m] for m in models]
        return Recording(
            models,
            np.asarray(self._times, dtype=np.float64),
            allocated[:, order],
            tuple(self._frag),
            tuple(self._steps),
        )


# --- the metrics -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    name: str
    weight: float
    jobs: int
    finished: int
    avg_jct_s: float | None
    avg_queueing_s: float | None
    p95_queueing_s: float | None
    avg_slowdown: float | None
    gpu_hours: float
    gpu_share_pct: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "weight": self.weight,
            "jobs": self.jobs,
            "finished": self.finished,
            "avg_jct_s": _round(self.avg_jct_s),
            "avg_queueing_s": _round(self.avg_queueing_s),
            "p95_queueing_s": _round(self.p95_queueing_s),
            "avg_slowdown": _round(self.avg_slowdown),
            "gpu_hours": round(self.gpu_hours, 6),
            "gpu_share_pct": round(self.gpu_share_pct, 4),
        }


@dataclass(frozen=True)
class PolicyMetrics:
    """Every metric of one policy's run. `as_dict()` gives them under flat snake_case keys (see the module
    docstring for definitions); `timing` holds the wall-clock figures, the only non-deterministic ones."""

    policy: str
    workload: str
    jobs: int
    jobs_finished: int
    jobs_failed: int
    jobs_unfinished: int
    jobs_never_started: int
    jct: Summary
    queueing: Summary
    pending: Summary
    slowdown: Summary
    ftf_rho: Summary
    ftf_unfair_pct: float | None
    makespan_s: float
    gpu_alloc_pct: float
    gpu_hours_allocated: float
    gpu_hours_by_model: Mapping[str, float]
    cost_usd: float | None
    cost_usd_by_model: Mapping[str, float]
    unpriced_models: tuple[str, ...]
    fragmentation_pct_of_capacity: float | None
    fragmentation_ratio_pct_of_idle: float | None
    fragmentation_samples: int
    preemptions: int
    jobs_preempted: int
    backend_launches: int
    backend_stops: int
    lost_work_s: float
    lost_gpu_hours: float
    restart_penalty_gpu_hours: float
    node_failures: int
    jobs_lost_to_failures: int
    failure_lost_work_s: float
    failure_lost_gpu_hours: float
    node_down_gpu_hours: float
    cluster_events: int
    jain_slowdown: float | None
    jain_gpu_share: float | None
    queues: tuple[QueueMetrics, ...]
    fgd_steps: tuple[FgdStep, ...]
    sim_steps: int
    sim_events: int
    timing: Mapping[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.policy,
            "workload": self.workload,
            "jobs": self.jobs,
            "jobs_finished": self.jobs_finished,
            "jobs_failed": self.jobs_failed,
            "jobs_unfinished": self.jobs_unfinished,
            "jobs_never_started": self.jobs_never_started,
        }
        out |= self.jct.flat("jct", "_s")
        out |= self.queueing.flat("queueing", "_s")
        out |= self.pending.flat("pending", "_s")
        out |= self.slowdown.flat("slowdown")
        out |= self.ftf_rho.flat("ftf_rho")
        out |= {
            "ftf_unfair_pct": _round(self.ftf_unfair_pct, 4),
            "makespan_s": round(self.makespan_s, 6),
            "gpu_alloc_pct": round(self.gpu_alloc_pct, 4),
            "gpu_hours_allocated": round(self.gpu_hours_allocated, 6),
            "gpu_hours_by_model": {m: round(h, 6) for m, h in self.gpu_hours_by_model.items()},
            "cost_usd": _round(self.cost_usd, 4),
            "cost_usd_by_model": {m: round(c, 4) for m, c in self.cost_usd_by_model.items()},
            "unpriced_models": list(self.unpriced_models),
            "fragmentation_pct_of_capacity": _round(self.fragmentation_pct_of_capacity, 4),
            "fragmentation_ratio_pct_of_idle": _round(self.fragmentation_ratio_pct_of_idle, 4),
            "fragmentation_samples": self.fragmentation_samples,
            "preemptions": self.preemptions,
            "jobs_preempted": self.jobs_preempted,
            "backend_launches": self.backend_launches,
            "backend_stops": self.backend_stops,
            "lost_work_s": round(self.lost_work_s, 6),
            "lost_gpu_hours": round(self.lost_gpu_hours, 6),
            "restart_penalty_gpu_hours": round(self.restart_penalty_gpu_hours, 6),
            "node_failures": self.node_failures,
            "jobs_lost_to_failures": self.jobs_lost_to_failures,
            "failure_lost_work_s": round(self.failure_lost_work_s, 6),
            "failure_lost_gpu_hours": round(self.failure_lost_gpu_hours, 6),
            "node_down_gpu_hours": round(self.node_down_gpu_hours, 6),
            "cluster_events": self.cluster_events,
            "jain_slowdown": _round(self.jain_slowdown),
            "jain_gpu_share": _round(self.jain_gpu_share),
            "sim_steps": self.sim_steps,
            "sim_events": self.sim_events,
            "queues": {q.name: q.as_dict() for q in self.queues},
            "fgd_steps": [s.as_dict() for s in self.fgd_steps],
            "timing": {k: round(v, 4) for k, v in self.timing.items()},
        }
        return out

    def scalars(self) -> dict[str, Any]:
        """The flat, one-value metrics (for a CSV row): everything but per-queue, per-model and per-step data."""
        return {
            k: v
            for k, v in self.as_dict().items()
            if not isinstance(v, dict | list) and k not in ("policy", "workload")
        }


def _gpus(record: JobRecord) -> float:
    return sum(s.milli for w in record.workers for s in w.gpus) / 1000.0


def received_gpu_seconds(record: JobRecord, end: float) -> float:
    """GPU-seconds a job received: over its past attempts, plus its current one up to `end`."""
    extra = 0.0
    if record.holds_resources and record.started_at is not None:
        extra = _gpus(record) * max(0.0, end - record.started_at)
    return record.attained_gpu_seconds + extra


def pending_times(records: Iterable[JobRecord], log: Iterable[Transition], end: float) -> dict[str, float]:
    """Per job, the seconds it spent in state `pending`, from the transition log (the submission itself is not a
    transition: a job is pending from `submitted_at`). Jobs still pending count until `end`."""
    since: dict[str, float] = {}
    total: dict[str, float] = {}
    for record in records:
        since[record.id] = record.submitted_at
        total[record.id] = 0.0
    pending = JobState.PENDING
    for t in log:
        if t.source is pending and t.target is not pending:
            start = since.pop(t.job_id, None)
            if start is not None:
                total[t.job_id] = total.get(t.job_id, 0.0) + max(0.0, t.at - start)
        elif t.target is pending and t.source is not pending:
            since[t.job_id] = t.at
    for job_id, start in since.items():
        total[job_id] = total.get(job_id, 0.0) + max(0.0, end - start)
    return total


def _jobs_in_system(samples: Sequence[Sample]) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Sample times, jobs in the system (pending + running) after each, and the running integral at each time."""
    times = np.array([s.at for s in samples], dtype=np.float64)
    counts = np.array([s.pending + s.running for s in samples], dtype=np.float64)
    cumulative = np.concatenate(([0.0], np.cumsum(counts[:-1] * np.diff(times)))) if times.size else times
    return times, counts, cumulative


def _integral_at(t: FloatArray, times: FloatArray, counts: FloatArray, cumulative: FloatArray) -> FloatArray:
    idx = np.clip(np.searchsorted(times, t, side="right") - 1, 0, max(0, times.size - 1))
    return np.asarray(cumulative[idx] + counts[idx] * np.maximum(0.0, t - times[idx]), dtype=np.float64)


def _makespan_end(run: SimRun, records: Sequence[JobRecord]) -> float:
    finishes = [r.finished_at for r in records if r.finished_at is not None]
    if finishes and len(finishes) == len(records):
        return max(finishes)
    return max([run.end_time, *finishes])


def compute_metrics(
    run: SimRun,
    recording: Recording | None = None,
    *,
    prices: PriceTable | None = None,
    job_ids: Collection[str] | None = None,
    policy: str | None = None,
) -> PolicyMetrics:
    """The metrics of one run (definitions in the module docstring).

    `job_ids` restricts the job-level metrics (times, slowdown, rho, fairness, per-queue) to those jobs, as
    Gavel measures only jobs 4000-5000; cluster-level ones (allocation, GPU-hours, cost, makespan,
    fragmentation, backend counters) always cover the whole run.
    """
    workload = run.workload
    all_records = sorted(run.store.all(), key=lambda r: (r.job.submit_seq, r.id))
    records = [r for r in all_records if job_ids is None or r.id in job_ids]
    end = _makespan_end(run, all_records)
    makespan = max(0.0, end - (workload.jobs[0].arrival if workload.jobs else 0.0))
    times = _JobTimes.of(run, records, all_records, end)
    gpu_alloc_pct, gpu_hours = _allocation(run, end, makespan)
    by_model = _gpu_hours_by_model(workload, recording, end, gpu_hours)
    cost, cost_by_model, unpriced = _costs(prices, by_model, workload)
    frag = recording.frag if recording is not None else ()
    frag_cap, frag_ratio = _fragmentation(frag, end)
    queues = _queue_metrics(workload, records, times, end)
    stats = run.stats
    return PolicyMetrics(
        policy=policy or run.profile.name,
        workload=workload.name,
        jobs=len(records),
        jobs_finished=len(times.finished),
        jobs_failed=sum(1 for r in records if r.state is JobState.FAILED),
        jobs_unfinished=len(records) - len(times.finished),
        jobs_never_started=sum(1 for r in records if r.first_started_at is None),
        jct=Summary.of(times.jct.values()),
        queueing=Summary.of(times.queueing),
        pending=Summary.of(times.pending.get(r.id, 0.0) for r in records),
        slowdown=Summary.of(times.slowdown.values()),
        ftf_rho=Summary.of(times.rho),
        ftf_unfair_pct=100.0 * sum(1 for x in times.rho if x > 1.0) / len(times.rho) if times.rho else None,
        makespan_s=makespan,
        gpu_alloc_pct=gpu_alloc_pct,
        gpu_hours_allocated=gpu_hours,
        gpu_hours_by_model=dict(sorted(by_model.items())),
        cost_usd=cost,
        cost_usd_by_model=dict(sorted(cost_by_model.items())),
        unpriced_models=tuple(unpriced),
        fragmentation_pct_of_capacity=frag_cap,
        fragmentation_ratio_pct_of_idle=frag_ratio,
        fragmentation_samples=len(frag),
        preemptions=sum(r.preemptions for r in records),
        jobs_preempted=sum(1 for r in records if r.preemptions),
        backend_launches=stats.launches,
        backend_stops=stats.stops,
        lost_work_s=stats.lost_work_seconds,
        lost_gpu_hours=stats.lost_gpu_seconds / 3600.0,
        restart_penalty_gpu_hours=stats.penalty_gpu_seconds / 3600.0,
        node_failures=stats.node_failures,
        jobs_lost_to_failures=stats.jobs_lost_to_failures,
        failure_lost_work_s=stats.failure_lost_work_seconds,
        failure_lost_gpu_hours=stats.failure_lost_gpu_seconds / 3600.0,
        node_down_gpu_hours=run.node_down_gpu_seconds / 3600.0,
        cluster_events=len(run.cluster_log),
        jain_slowdown=jain_index([q.avg_slowdown for q in queues if q.avg_slowdown is not None]),
        jain_gpu_share=jain_index([q.gpu_hours / q.weight for q in queues]) if any(times.received.values()) else None,
        queues=queues,
        fgd_steps=recording.fgd_steps if recording is not None else (),
        sim_steps=run.steps,
        sim_events=run.events,
        timing={
            "wall_s": run.wall_seconds,
            "core_s": run.core_seconds,
            "events_per_s": run.events / run.wall_seconds if run.wall_seconds > 0 else 0.0,
        },
    )


@dataclass(frozen=True, slots=True)
class _JobTimes:
    """The job-level times of the measured jobs: JCT, first queueing, pending, slowdown and rho."""

    finished: list[JobRecord]
    jct: dict[str, float]
    queueing: list[float]
    pending: dict[str, float]
    slowdown: dict[str, float]
    rho: list[float]
    received: dict[str, float]

    @classmethod
    def of(cls, run: SimRun, records: list[JobRecord], all_records: list[JobRecord], end: float) -> _JobTimes:
        duration = {tj.id: tj.duration for tj in run.workload.jobs}
        finished = [r for r in records if r.finished_at is not None]
        jct = {r.id: r.finished_at - r.submitted_at for r in finished if r.finished_at is not None}
        slowdown = {j: t / d for j, t in jct.items() if (d := duration.get(j)) and d > 0}
        return cls(
            finished,
            jct,
            [r.first_started_at - r.submitted_at for r in records if r.first_started_at is not None],
            pending_times(all_records, run.store.log, end),
            slowdown,
            _finish_time_fairness(run, [r for r in finished if r.id in slowdown], duration),
            {r.id: received_gpu_seconds(r, end) for r in records},
        )


def _finish_time_fairness(run: SimRun, timed: list[JobRecord], duration: Mapping[str, float | None]) -> list[float]:
    """Themis' rho of each finished job with a run time (see the module docstring)."""
    capacity_gpus = run.workload.gpu_count
    if not (timed and run.samples and capacity_gpus):
        return []
    times, counts, cumulative = _jobs_in_system(run.samples)
    a = np.array([r.submitted_at for r in timed], dtype=np.float64)
    b = np.array([r.finished_at for r in timed], dtype=np.float64)
    span = b - a
    inside = _integral_at(b, times, counts, cumulative) - _integral_at(a, times, counts, cumulative)
    at_submit = counts[np.clip(np.searchsorted(times, a, side="right") - 1, 0, times.size - 1)]
    contenders = np.maximum(1.0, np.where(span > 0, inside / np.where(span > 0, span, 1.0), at_submit))
    gpus = np.array([r.job.gpu_milli_total / 1000.0 for r in timed], dtype=np.float64)
    run_time = np.array([duration[r.id] or 0.0 for r in timed], dtype=np.float64)
    run_time /= _equal_share_speeds(run.workload, [r.job for r in timed])
    isolated = run_time * np.maximum(1.0, gpus * contenders / capacity_gpus)
    return [float(x) for x in span / isolated]


def _allocation(run: SimRun, end: float, makespan: float) -> tuple[float, float]:
    """(GPU allocation %, GPU-hours allocated) from the per-step samples."""
    capacity_milli = run.workload.gpu_capacity_milli
    sample_times = np.array([s.at for s in run.samples], dtype=np.float64)
    sample_alloc = np.array([s.allocated_milli for s in run.samples], dtype=np.float64)
    sample_capacity = np.array([s.capacity_milli or capacity_milli for s in run.samples], dtype=np.float64)
    if sample_capacity.size and bool(np.any(sample_capacity != capacity_milli)):
        # Nodes joined during the run: allocated over installed capacity, both integrated over time.
        capacity_integral = _integral(sample_times, sample_capacity, end)
        gpu_alloc_pct = (
            100.0 * _integral(sample_times, sample_alloc, end) / capacity_integral
            if capacity_integral > 0
            else 100.0 * float(sample_alloc[-1]) / max(1.0, float(sample_capacity[-1]))
        )
    else:
        gpu_alloc_pct = (
            100.0 * _integral(sample_times, sample_alloc, end) / (capacity_milli * makespan)
            if capacity_milli and makespan > 0
            else (100.0 * float(sample_alloc[-1]) / capacity_milli if capacity_milli and sample_alloc.size else 0.0)
        )
    return gpu_alloc_pct, _integral(sample_times, sample_alloc, end) / 1000.0 / 3600.0


def _gpu_hours_by_model(
    workload: Workload, recording: Recording | None, end: float, gpu_hours: float
) -> dict[str, float]:
    """GPU-hours allocated per GPU model (from the recording; a one-model fleet needs none)."""
    by_model: dict[str, float] = {}
    if recording is not None and recording.times.size:
        for m, model in enumerate(recording.models):
            hours = _integral(recording.times, recording.allocated_milli[:, m].astype(np.float64), end) / 3.6e6
            by_model[model] = hours
    elif len(workload.models) == 1:
        by_model[next(iter(workload.models))] = gpu_hours
    return by_model


def _costs(
    prices: PriceTable | None, by_model: Mapping[str, float], workload: Workload
) -> tuple[float | None, dict[str, float], list[str]]:
    """(total USD or None, USD per priced model, models without a price)."""
    cost_by_model: dict[str, float] = {}
    unpriced: list[str] = []
    if prices is None:
        return None, cost_by_model, unpriced
    for model, hours in sorted(by_model.items()):
        price = prices.price(model)
        if price is None:
            unpriced.append(model)
        else:
            cost_by_model[model] = hours * price
    if not by_model:
        unpriced = sorted(workload.models)
    cost = sum(cost_by_model.values()) if cost_by_model or not unpriced else None
    return cost, cost_by_model, unpriced


def _fragmentation(frag: Sequence[FragSample], end: float) -> tuple[float | None, float | None]:
    """Time-weighted fragmentation, % of capacity and % of idle (None without samples)."""
    if not frag:
        return None, None
    frag_times = np.array([f.at for f in frag], dtype=np.float64)
    frag_end = max(end, float(frag_times[-1]))
    frag_cap = 100.0 * time_average(frag_times, [f.fragmented_milli / f.capacity_milli for f in frag], frag_end)
    ratios = [f.fragmented_milli / f.idle_milli if f.idle_milli else 0.0 for f in frag]
    return frag_cap, 100.0 * time_average(frag_times, ratios, frag_end)


def _queue_metrics(
    workload: Workload, records: list[JobRecord], times: _JobTimes, end: float
) -> tuple[QueueMetrics, ...]:
    """Per queue: jobs, JCT, queueing, slowdown and the GPU time it received (and its share of all)."""
    weights = {q.name: q.weight for q in workload.queues}
    received = times.received
    total_received = sum(received.values())
    queues: list[QueueMetrics] = []
    for name in sorted({r.job.queue for r in records}):
        members = [r for r in records if r.job.queue == name]
        q_jct = Summary.of(times.jct[r.id] for r in members if r.id in times.jct)
        q_wait = Summary.of(r.first_started_at - r.submitted_at for r in members if r.first_started_at is not None)
        q_slow = Summary.of(times.slowdown[r.id] for r in members if r.id in times.slowdown)
        q_gpu = sum(received[r.id] for r in members)
        queues.append(
            QueueMetrics(
                name,
                weights.get(name, 1.0),
                len(members),
                q_jct.count,
                q_jct.avg,
                q_wait.avg,
                q_wait.p95,
                q_slow.avg,
                q_gpu / 3600.0,
                100.0 * q_gpu / total_received if total_received else 0.0,
            )
        )
    return tuple(queues)


def job_completion_times(run: SimRun, job_ids: Collection[str] | None = None) -> FloatArray:
    """JCTs of the finished jobs (in submission order), for plots."""
    records = sorted(run.store.all(), key=lambda r: (r.job.submit_seq, r.id))
    return np.array(
        [
            r.finished_at - r.submitted_at
            for r in records
            if r.finished_at is not None and (job_ids is None or r.id in job_ids)
        ],
        dtype=np.float64,
    )


def _equal_share_speeds(workload: Workload, jobs: list[Job]) -> npt.NDArray[np.float64]:
    """Each job's speed on an equal share of every GPU of the cluster, relative to the reference model (1.0
    without a throughput table, or for a job type or GPU count it lacks)."""
    table = workload.throughput
    speeds = np.ones(len(jobs), dtype=np.float64)
    if table is None or table.reference is None:
        return speeds
    models: dict[str, int] = {}
    for node in workload.nodes:
        for gpu in node.gpus:
            models[gpu.model] = models.get(gpu.model, 0) + 1
    total = sum(models.values())
    cache: dict[tuple[str, int, bool], float] = {}
    for i, job in enumerate(jobs):
        gpus, consolidated = job_scale(job)
        key = (job.job_type, gpus, consolidated)
        if key not in cache:
            try:
                cache[key] = (
                    sum(
                        table.relative_speed(job.job_type, m, gpus, consolidated=consolidated) * n
                        for m, n in models.items()
                    )
                    / total
                )
            except WorkloadError:
                cache[key] = 1.0
        speeds[i] = cache[key] if cache[key] > 0 else 1.0
    return speeds
