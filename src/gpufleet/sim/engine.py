"""The discrete-event simulator: the live `Reconciler`, driven by an event heap and simulated ports.

Events are ordered by `(time, seq)`: trace arrivals, observations the simulated backend scheduled
(starts, exits, stops), and retry ticks. At each distinct time the due events are applied and the
reconciler takes one step, exactly as the live loop does after a wake-up. Same workload, profile and
seed: the same event log, byte for byte.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import Job
from gpufleet.domain.lifecycle import Transition
from gpufleet.ports import Observation
from gpufleet.scheduling.plugins import Profile
from gpufleet.sim.backend import BackendSettings, BackendStats, SimulatedBackend
from gpufleet.sim.workload import TraceJob, Workload

ARRIVAL = 0
OBSERVATION = 1
RETRY = 2


class SimClock:
    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t


@dataclass(frozen=True)
class SimSettings:
    backend: BackendSettings = field(default_factory=BackendSettings)
    reconciler: ReconcilerSettings = field(default_factory=ReconcilerSettings)
    horizon_s: float | None = None  # stop at this simulated time (None: when nothing is left to happen)


@dataclass
class Sample:
    """The cluster after one step: time, milli-GPUs allocated, jobs pending and running."""

    at: float
    allocated_milli: int
    pending: int
    running: int


@dataclass
class SimRun:
    workload: Workload
    profile: Profile
    store: InMemoryStore
    stats: BackendStats
    samples: list[Sample]
    steps: int
    events: int
    wall_seconds: float
    core_seconds: float
    end_time: float

    @property
    def log(self) -> list[Transition]:
        return self.store.log


Observer = Callable[[float, Reconciler], None]


class Simulation:
    def __init__(
        self,
        workload: Workload,
        profile: Profile,
        settings: SimSettings | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.workload = workload
        self.profile = profile
        self.settings = settings or SimSettings()
        self.observer = observer
        self.clock = SimClock(workload.jobs[0].arrival if workload.jobs else 0.0)
        self.store = InMemoryStore(workload.nodes, workload.queues)
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        work = {t.id: t.duration for t in workload.jobs}
        self.backend = SimulatedBackend(
            self.clock, self._schedule_observation, work, self._speed, self.settings.backend
        )
        self.reconciler = Reconciler(self.store, self.backend, self.clock, profile, settings=self.settings.reconciler)
        self._retry_at: float | None = None

    def _push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, payload))

    def _schedule_observation(self, at: float, observation: Observation) -> None:
        self._push(at, OBSERVATION, observation)

    def _speed(self, job: Job, workers: tuple[WorkerPlacement, ...]) -> float:
        table = self.workload.throughput
        if table is None or not job.job_type or not workers:
            return 1.0
        gpus = max(1, job.request.gpus)
        names = self.reconciler.base.table.gpu_model_names
        index = self.reconciler.base.table.index
        models = {names[index[w.node]][s.index] for w in workers for s in w.gpus}
        speeds = [table.relative_speed(job.job_type, m, gpus) for m in sorted(models)]
        return min(speeds) if speeds else 1.0

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimRun:
        started = time.perf_counter()
        arrivals: Iterator[TraceJob] = iter(self.workload.jobs)
        next_arrival = next(arrivals, None)
        if next_arrival is not None:
            self._push(next_arrival.arrival, ARRIVAL, next_arrival)
        samples: list[Sample] = []
        steps = events = 0
        core = 0.0
        arrived = 0
        total = len(self.workload.jobs)
        horizon = self.settings.horizon_s
        while self._heap:
            now = self._heap[0][0]
            if horizon is not None and now > horizon:
                break
            self.clock.t = now
            while self._heap and self._heap[0][0] == now:
                _, _, kind, payload = heapq.heappop(self._heap)
                events += 1
                if kind == ARRIVAL:
                    assert isinstance(payload, TraceJob)
                    self.store.submit(payload.job, now)
                    arrived += 1
                    next_arrival = next(arrivals, None)
                    if next_arrival is not None:
                        self._push(next_arrival.arrival, ARRIVAL, next_arrival)
                elif kind == OBSERVATION:
                    assert isinstance(payload, Observation)
                    self.backend.deliver(payload)
                elif kind == RETRY:
                    self._retry_at = None
            report = self.reconciler.step()
            steps += 1
            core += report.core_seconds
            base = self.reconciler.base
            samples.append(
                Sample(
                    now,
                    int(base.table.gpu_milli_total.sum() - base.table.node_milli_free.sum()),
                    len(self.reconciler.pending),
                    len(base.holdings),
                )
            )
            if self.observer is not None:
                self.observer(now, self.reconciler)
            retry = self.reconciler.next_retry_at()
            if retry is not None and self._retry_at is None and self._heap:
                # A retry time at or before now (float rounding: last + 300 - last < 300) would step at `now`
                # forever; the next representable time is the earliest a retry can still change anything.
                self._retry_at = retry if retry > now else math.nextafter(now, math.inf)
                self._push(self._retry_at, RETRY, None)
            if progress is not None:
                progress(arrived, total)
        return SimRun(
            self.workload,
            self.profile,
            self.store,
            self.backend.stats,
            samples,
            steps,
            events,
            time.perf_counter() - started,
            core,
            self.clock.t,
        )
