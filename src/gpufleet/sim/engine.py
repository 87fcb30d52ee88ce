"""The discrete-event simulator: the live `Reconciler`, driven by an event heap and simulated ports.

Events are ordered by `(time, seq)`: trace arrivals, observations the simulated backend scheduled
(starts, exits, stops), retry ticks, and cluster events (`gpufleet.sim.events`: the workload's own and
those of the failure model). At each distinct time the due events are applied and the reconciler takes
one step, exactly as the live loop does after a wake-up. Cluster events change the store's nodes and
queues (`set_cluster`), which the reconciler sees at its next step as the live one sees an operator's
change; a node that goes down takes its jobs with it (the backend reports them LOST, the loop retries
them). Same workload, profile, settings and seed: the same event log, byte for byte.

When the run ends: when no arrival or observation is left to come, and either no job is waiting or no
cluster event that could let one in (a repair, added nodes, a quota change, a retry tick) is due before
the last such event already scheduled at that moment. Failures alone never keep a run going (with a
failure model some node is always about to fail). With a failure model and no horizon given, the run
stops at `failure_horizon()`: jobs that do not checkpoint may never outlast failures that come often
enough, and such a run would not end; what is left unfinished there is counted as unfinished.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.reconciler import Reconciler, ReconcilerSettings
from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.jobs import Job
from gpufleet.domain.lifecycle import Transition
from gpufleet.domain.progress import Report, ReportContext, fold
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.throughput_table import job_scale
from gpufleet.ports import Observation
from gpufleet.scheduling.comm_gate import placement_estimate
from gpufleet.scheduling.plugin_api import Profile
from gpufleet.sim.events import (
    AddNodes,
    ClusterEvent,
    FailureModel,
    NodeDown,
    NodeFailureClock,
    NodeUp,
    QuotaChange,
    describe,
)
from gpufleet.sim.simulated_backend import BackendSettings, BackendStats, SimulatedBackend
from gpufleet.sim.workload import TraceJob, Workload

ARRIVAL = 0
OBSERVATION = 1
RETRY = 2
CLUSTER = 3


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
    failures: FailureModel | None = None  # random node failures and repairs (None: nodes never fail)
    # Stop once these jobs have all ended (Gavel's simulator stops when its measured jobs are done); None: run on.
    until_done: frozenset[str] | None = None
    # Jobs' communication needs (`Job.comm`) kept from the scheduler, which then places as if they had none; their
    # runs are stretched by them all the same. A study's baseline: what the communication model changes.
    comm_hidden: bool = False


FAILURE_HORIZON_FACTOR = 20.0
UNTIL_DONE_EVERY = 256  # steps between checks of `SimSettings.until_done`


def failure_horizon(workload: Workload) -> float:
    """Where a run with random failures stops if no horizon is given: after the last arrival, 20 times the
    longer of the longest job and the time the whole cluster needs for all the work (GPU-seconds / GPUs)."""
    if not workload.jobs:
        return 0.0
    durations = [tj.duration or 0.0 for tj in workload.jobs]
    work = sum(d * tj.gpu_milli_total / 1000.0 for d, tj in zip(durations, workload.jobs, strict=True))
    ideal = max(*durations, work / max(1, workload.gpu_count), 3600.0)
    return workload.jobs[-1].arrival + FAILURE_HORIZON_FACTOR * ideal


@dataclass(frozen=True, slots=True)
class _Due:
    """A cluster event in the heap; `generated` when the failure model made it (not the workload)."""

    event: ClusterEvent
    generated: bool = False

    @property
    def may_help(self) -> bool:
        """Whether it can let a waiting job in: anything but a failure the model drew."""
        return not (self.generated and isinstance(self.event, NodeDown))


@dataclass(frozen=True, slots=True)
class ClusterChange:
    """One applied cluster event in the run's cluster log: when, what (`down`, `up`, `quota`, `add`), on what
    (node, queue, or the added nodes), and the detail (for `down`: the jobs lost, by id and attempt)."""

    at: float
    kind: str
    target: str
    detail: str
    generated: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"at": self.at, "kind": self.kind, "target": self.target, "detail": self.detail}


@dataclass
class Sample:
    """The cluster after one step: time, milli-GPUs allocated, jobs pending and running."""

    at: float
    allocated_milli: int
    pending: int
    running: int
    capacity_milli: int = 0  # GPUs installed (healthy or not), in milli-GPU


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
    cluster_log: list[ClusterChange] = field(default_factory=list)
    node_down_gpu_seconds: float = 0.0  # GPU capacity unavailable while nodes were down
    horizon_s: float | None = None  # the time the run was to stop at (None: when nothing was left)
    cut_short: bool = False  # whether it stopped there with events still to come

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
        # Whether an arriving job is taken (False: refused, as the API refuses a submission: a queue whose spent
        # budget blocks); None takes every arrival.
        self.admission: Callable[[Job, float], bool] | None = None
        first = [workload.jobs[0].arrival] if workload.jobs else []
        first += [min(e.at for e in workload.events)] if workload.events else []
        self.start = min(first) if first else 0.0
        self.clock = SimClock(self.start)
        self.nodes: dict[str, Node] = {n.name: n for n in workload.nodes}
        self.queues: dict[str, QueueSpec] = {q.name: q for q in workload.queues}
        self.store = InMemoryStore(workload.nodes, workload.queues)
        for window in workload.windows:
            self.store.set_window(window)
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._essential = 0  # arrivals and observations in the heap: while any is left, the run goes on
        self._helpful = 0  # retry ticks and cluster events that may let a waiting job in
        work = {t.id: t.duration for t in workload.jobs}
        self._comm = {t.id: t.job.comm for t in workload.jobs if t.job.comm is not None}
        self.backend = SimulatedBackend(
            self.clock,
            self._schedule_observation,
            work,
            self._speed,
            self.settings.backend,
            model=workload.work,
            reporter=self._report if workload.work is not None else None,
        )
        self.reconciler = Reconciler(self.store, self.backend, self.clock, profile, settings=self.settings.reconciler)
        self._retry_at: float | None = None
        self._failure_clocks: dict[str, NodeFailureClock] = {}
        self._down_since: dict[str, float] = {}
        self.cluster_log: list[ClusterChange] = []
        self.node_down_gpu_seconds = 0.0

    def _push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, payload))
        if kind in (ARRIVAL, OBSERVATION):
            self._essential += 1
        elif kind == RETRY or (isinstance(payload, _Due) and payload.may_help):
            self._helpful += 1

    def _pop(self) -> tuple[float, int, object]:
        at, _, kind, payload = heapq.heappop(self._heap)
        if kind in (ARRIVAL, OBSERVATION):
            self._essential -= 1
        elif kind == RETRY or (isinstance(payload, _Due) and payload.may_help):
            self._helpful -= 1
        return at, kind, payload

    def _schedule_observation(self, at: float, observation: Observation) -> None:
        self._push(at, OBSERVATION, observation)

    def _report(self, job_id: str, attempt: int, gpus: int, at: float, values: Mapping[str, float]) -> None:
        """A simulated job's progress report, folded into the store as the API folds a real one's."""
        report = Report("progress", at, dict(values))
        context = ReportContext(attempt, gpus, at)
        self.store.update_progress(job_id, at, lambda progress: fold(progress, [report], context))

    def _speed(self, job: Job, workers: tuple[WorkerPlacement, ...]) -> float:
        """Relative speed on these workers: the GPU models' (throughput table), stretched for a job that declares
        what it synchronises by its step's predicted all-reduce (`domain.comm`, the model placement uses)."""
        speed = self._model_speed(job, workers)
        comm = self._comm.get(job.id)
        if comm is not None and workers:
            speed *= comm.slowdown_of(placement_estimate(comm, self.reconciler.base.table, workers))
        return speed

    def _model_speed(self, job: Job, workers: tuple[WorkerPlacement, ...]) -> float:
        table = self.workload.throughput
        if table is None or not job.job_type or not workers:
            return 1.0
        gpus, consolidated = job_scale(job)
        names = self.reconciler.base.table.gpu_model_names
        index = self.reconciler.base.table.index
        models = {names[index[w.node]][s.index] for w in workers for s in w.gpus}
        speeds = [
            table.relative_speed(job.job_type, m, max(1, gpus), consolidated=consolidated) for m in sorted(models)
        ]
        return min(speeds) if speeds else 1.0

    # --- cluster events ----------------------------------------------------------------------------

    def _start_failures(self, nodes: list[str], at: float) -> None:
        model = self.settings.failures
        if model is None:
            return
        for name in sorted(nodes):
            if model.pool is not None and self.nodes[name].pool != model.pool:
                continue
            self._failure_clocks[name] = clock = model.clock(name)
            self._push_failure(clock, at)

    def _push_failure(self, clock: NodeFailureClock, after: float) -> None:
        at = clock.next_failure(after)
        self._push(at, CLUSTER, _Due(NodeDown(at, clock.node, _failure_reason(clock.model)), True))

    def _apply(self, now: float, due: _Due) -> None:
        event = due.event
        if isinstance(event, NodeDown):
            self._node_down(now, event.node, event.reason, due.generated)
        elif isinstance(event, NodeUp):
            self._node_up(now, event.node, due.generated)
        elif isinstance(event, QuotaChange):
            self.queues[event.queue.name] = event.queue
            self.store.set_cluster(queues=tuple(self.queues.values()))
            self._log(now, "quota", event.queue.name, describe(event).split(": ", 1)[1])
        elif isinstance(event, AddNodes):
            for node in event.nodes:
                self.nodes[node.name] = node
            self.store.set_cluster(nodes=tuple(self.nodes.values()))
            self._log(now, "add", ",".join(n.name for n in event.nodes), describe(event).split(": ", 1)[1])
            self._start_failures([n.name for n in event.nodes], now)

    def _node_down(self, now: float, name: str, reason: str, generated: bool) -> None:
        node = self.nodes[name]
        clock = self._failure_clocks.get(name) if generated else None
        if not node.healthy:
            if clock is not None:  # already down (an explicit event): this failure did not happen; draw the next
                self._push_failure(clock, now)
            return
        self.nodes[name] = replace(node, healthy=False)
        self._down_since[name] = now
        self.store.set_cluster(nodes=tuple(self.nodes.values()))
        losses = self.backend.fail_node(name, reason)
        lost = ", ".join(f"{loss.job_id}#{loss.attempt}" for loss in losses) or "none"
        self._log(now, "down", name, f"{reason}; jobs lost: {lost}", generated)
        if clock is not None:
            at = clock.next_repair(now)
            self._push(at, CLUSTER, _Due(NodeUp(at, name), True))

    def _node_up(self, now: float, name: str, generated: bool) -> None:
        node = self.nodes[name]
        clock = self._failure_clocks.get(name)
        if node.healthy:
            return  # already up (an explicit event repaired it first); its failure clock is running already
        self.nodes[name] = replace(node, healthy=True)
        self.node_down_gpu_seconds += len(node.gpus) * (now - self._down_since.pop(name, now))
        self.store.set_cluster(nodes=tuple(self.nodes.values()))
        self._log(now, "up", name, "repaired" if generated else "back up", generated)
        if clock is not None:
            self._push_failure(clock, now)

    def _log(self, now: float, kind: str, target: str, detail: str, generated: bool = False) -> None:
        self.cluster_log.append(ClusterChange(now, kind, target, detail, generated))

    def _keeps_going(self, at: float, hold: float | None) -> tuple[bool, float | None]:
        """Whether the run goes on to the next event (at `at`), and until when the current waiting phase lasts
        (see the module docstring). With nothing essential left, the run goes on until the last retry tick
        already scheduled, and, while jobs wait, the last cluster event that may let one in."""
        if self._essential:
            return True, None
        if not self._helpful:
            return False, hold
        if hold is None:
            waiting = len(self.reconciler.pending) > 0
            hold = max(
                (
                    t
                    for t, _, kind, payload in self._heap
                    if kind == RETRY or (waiting and isinstance(payload, _Due) and payload.may_help)
                ),
                default=-math.inf,
            )
        return at <= hold, hold

    # --- the loop ------------------------------------------------------------------------------------

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimRun:
        started = time.perf_counter()
        arrivals: Iterator[TraceJob] = iter(self.workload.jobs)
        next_arrival = next(arrivals, None)
        if next_arrival is not None:
            self._push(next_arrival.arrival, ARRIVAL, next_arrival)
        for event in sorted(self.workload.events, key=lambda e: e.at):
            self._push(event.at, CLUSTER, _Due(event))
        self._start_failures(list(self.nodes), self.start)
        samples: list[Sample] = []
        steps = events = 0
        core = 0.0
        arrived = 0
        total = len(self.workload.jobs)
        horizon = self.settings.horizon_s
        if horizon is None and self.settings.failures is not None:
            horizon = failure_horizon(self.workload)
        hold: float | None = None
        cut_short = False
        capacity_of: tuple[object, int] = (None, 0)
        watched = set(self.settings.until_done) if self.settings.until_done else set()
        while self._heap:
            now = self._heap[0][0]
            if horizon is not None and now > horizon:
                cut_short = bool(self._essential)
                break
            going, hold = self._keeps_going(now, hold)
            if not going:
                break
            self.clock.t = now
            while self._heap and self._heap[0][0] == now:
                _, kind, payload = self._pop()
                events += 1
                if kind == ARRIVAL:
                    assert isinstance(payload, TraceJob)
                    job = payload.job
                    if self.admission is None or self.admission(job, now):
                        self.store.submit(
                            replace(job, comm=None) if job.comm and self.settings.comm_hidden else job, now
                        )
                    arrived += 1
                    next_arrival = next(arrivals, None)
                    if next_arrival is not None:
                        self._push(next_arrival.arrival, ARRIVAL, next_arrival)
                elif kind == OBSERVATION:
                    assert isinstance(payload, Observation)
                    self.backend.deliver(payload)
                elif kind == RETRY:
                    self._retry_at = None
                elif kind == CLUSTER:
                    assert isinstance(payload, _Due)
                    self._apply(now, payload)
            self.backend.report_until(now)  # what running jobs reported since the last step
            report = self.reconciler.step()
            steps += 1
            core += report.core_seconds
            base = self.reconciler.base
            if base.table is not capacity_of[0]:  # a new table only when the cluster changed
                capacity_of = (base.table, int(base.table.gpu_milli_total.sum()))
            capacity = capacity_of[1]
            samples.append(
                Sample(
                    now,
                    int(capacity - base.table.node_milli_free.sum()),
                    len(self.reconciler.pending),
                    len(base.holdings),
                    capacity,
                )
            )
            if self.observer is not None:
                self.observer(now, self.reconciler)
            retry = self.reconciler.next_retry_at()
            # With resizes, the next resize tick may come before a retry already planned.
            planned = self._retry_at
            resizing = self.reconciler.resizer is not None
            earlier = planned is None or (resizing and retry is not None and retry < planned)
            if retry is not None and earlier and (self._essential or self._helpful):
                # A retry time at or before now (float rounding: last + 300 - last < 300) would step at `now`
                # forever; the next representable time is the earliest a retry can still change anything.
                self._retry_at = retry if retry > now else math.nextafter(now, math.inf)
                self._push(self._retry_at, RETRY, None)
            if progress is not None:
                progress(arrived, total)
            if watched and steps % UNTIL_DONE_EVERY == 0:
                watched = {j for j in watched if (r := self.store.get(j)) is None or not r.state.terminal}
                if not watched:
                    break
        end = self.clock.t
        for name, since in self._down_since.items():
            self.node_down_gpu_seconds += len(self.nodes[name].gpus) * max(0.0, end - since)
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
            end,
            self.cluster_log,
            self.node_down_gpu_seconds,
            horizon,
            cut_short,
        )


def _failure_reason(model: FailureModel) -> str:
    return f"random failure (MTBF {model.mtbf_hours:g} h)"
