"""GPU telemetry in the control plane: sampling, `/metrics`, reserved-but-idle detection and its policies.

Two threads feed it, and scrapes read it without touching the store:

- the **control loop** calls `LoopObserver.after_step` after every step (in the loop's own thread, so what
  it reads of the reconciler is consistent): it publishes the pending jobs and what each running job holds
  (dictionary copies, microseconds), and counts what happened (jobs started with their queue wait,
  preemptions and requeues per queue, scheduling cycles and their time);
- the **telemetry thread** runs `Telemetry.tick` every sample interval (default 5 s): it tells the probe
  who holds each GPU, samples every GPU into the ring, feeds the idle detector, applies each queue's idle
  policy to newly flagged jobs, and accounts usage.

The probe matches the inventory: NVML for GPUs discovered with NVML, the `emulated` probe for an emulated
inventory (every GPU series then says `probe="emulated"`). On an emulated inventory a job declares what it
does with its GPUs in its environment, `EMULATED_GPU_ACTIVITY=idle|light|busy` (default busy); the variable
is only read here, on emulated inventories: a real GPU reports what it really does.

GPU processes are mapped to jobs at each tick: the probe lists (pid, GPU memory) per GPU, and the executor
(`LocalBackend.owner_of`, through each worker's session and parent chain) says which job's worker each pid
belongs to. Per GPU this gives each job's memory, whether a job uses more than its share (fractional shares
are not enforced by the GPU), and the memory of processes that are no job's (the GPU is used outside the
scheduler: logged once per process, exported as `gpufleet_gpu_unattributed_memory_bytes`). On an emulated
inventory the emulated GPUs report the real pids of the jobs' workers, so the same mapping runs there.

Idle policies are per queue, in the store's settings (`idle_policy:<queue>`): `notify` (default: the flag is
logged, stored under `idle:<job>`, shown by `/v1/jobs/{id}/usage` and `/metrics`), `reclaim` (also asks the
loop to requeue the job if it is preemptible: checkpoint signal, grace period, back to its queue; its GPUs go
to waiting jobs) or `none` (not even logged; still counted in the metrics, which describe, not act).
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.adapters.metrics import (
    WAIT_BUCKETS_S,
    BudgetGauge,
    CostCounter,
    JobGpuMemory,
    QueueMetrics,
    SchedulerState,
    SpotPoolGauge,
    UnattributedMemory,
    WaitHistogram,
    make_registry,
    metrics_endpoint,
)
from gpufleet.adapters.probes import EmulatedProbe, Sampler, SampleRing
from gpufleet.adapters.storage.sql_engine import StoreUnavailableError
from gpufleet.control.reconciler import Reconciler, StepReport
from gpufleet.domain.cluster import Node
from gpufleet.domain.costs import BudgetLevel, BudgetStatus
from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.spot import BreakerState
from gpufleet.ports import RequestKind
from gpufleet.ports.admin import AdminStore, Notice
from gpufleet.ports.gpu_probe import ActivityLevel, GpuActivity, GpuOwner, GpuProbe, GpuSample
from gpufleet.scheduling.fragmentation import GENERIC_TARGET, TargetWorkload, cluster_fragmentation
from gpufleet.scheduling.plugin_api import Holding
from gpufleet.scheduling.table import NodeTable
from gpufleet.server.cost_meter import CostMeter
from gpufleet.server.idle import DEFAULT_THRESHOLD_PCT, DEFAULT_WINDOW_S, GpuKey, Holder, IdleDetector, IdleFlag
from gpufleet.server.spec import EMULATED_ACTIVITY_ENV
from gpufleet.server.spot_watch import STATE_CODES, PoolStatus
from gpufleet.server.usage import UsageBook

log = logging.getLogger("gpufleet.telemetry")

ACTIVITY_ENV = EMULATED_ACTIVITY_ENV
POLICY_KEY = "idle_policy:{queue}"
FLAG_KEY = "idle:{job}"
# (job id, attempt, rank): the worker a GPU process belongs to.
WorkerKey = tuple[str, int, int]
_LOGGED_STRANGERS_MAX = 10_000  # pids remembered as already logged (a bound, not a figure that matters)


# Builds a probe from the emulated activity per GPU and the pid weights (both read at each sample).
ProbeFactory = Callable[[Callable[[], Mapping[GpuKey, GpuActivity]], Callable[[], Mapping[int, int]]], GpuProbe]


class JobProcesses(Protocol):
    """What telemetry asks the executor (`LocalBackend` has both): who runs a process, and the other way."""

    def owner_of(self, pids: Iterable[int]) -> Mapping[int, WorkerKey]: ...

    def running_commands(self) -> Mapping[WorkerKey, int]: ...


class IdlePolicy(enum.StrEnum):
    NOTIFY = "notify"  # log and show the flag (default)
    RECLAIM = "reclaim"  # and requeue the job if it is preemptible
    NONE = "none"  # do nothing (the metrics still count it)


def idle_policy(store: AdminStore, queue: str) -> IdlePolicy:
    value = store.get_setting(POLICY_KEY.format(queue=queue))
    try:
        return IdlePolicy(value) if value else IdlePolicy.NOTIFY
    except ValueError:
        log.warning("idle policy of queue %s is %r, not one of notify/reclaim/none; using notify", queue, value)
        return IdlePolicy.NOTIFY


def set_idle_policy(store: AdminStore, queue: str, policy: str) -> IdlePolicy:
    try:
        chosen = IdlePolicy(policy)
    except ValueError:
        raise SpecError(
            "idle policy",
            (FieldProblem("policy", f"is {policy!r}", "use one of: notify, reclaim, none"),),
        ) from None
    store.set_setting(POLICY_KEY.format(queue=queue), chosen.value)
    return chosen


@dataclass(frozen=True)
class TelemetrySettings:
    interval_s: float = 5.0
    ring_length: int = 720  # samples kept per GPU (an hour at 5 s)
    idle_threshold_pct: float = DEFAULT_THRESHOLD_PCT
    idle_window_s: float = DEFAULT_WINDOW_S
    flush_interval_s: float = 60.0  # how often measured usage is added to the store

    def __post_init__(self) -> None:
        problems = []
        if self.interval_s <= 0:
            problems.append(FieldProblem("sample_interval", f"is {self.interval_s}", "give seconds > 0"))
        if not 0 < self.idle_threshold_pct <= 100:
            problems.append(
                FieldProblem("idle_threshold", f"is {self.idle_threshold_pct}", "give a percent in (0, 100]")
            )
        if self.idle_window_s <= 0:
            problems.append(FieldProblem("idle_window", f"is {self.idle_window_s}", "give seconds > 0"))
        if self.ring_length < 1:
            problems.append(FieldProblem("ring_length", f"is {self.ring_length}", "keep 1 or more samples"))
        if problems:
            raise SpecError("telemetry settings", tuple(problems))


BUDGET_LEVELS = {BudgetLevel.OK: 0, BudgetLevel.NOTICE: 1, BudgetLevel.EXCEEDED: 2}

# --------------------------------------------------------------------------------------- loop side


@dataclass(frozen=True)
class LoopView:
    """What the loop last published: pending jobs and holdings (copies, never changed after publication)."""

    at: float = 0.0
    pending: Mapping[JobId, Job] = field(default_factory=dict)
    holdings: Mapping[JobId, Holding] = field(default_factory=dict)
    stopping: frozenset[JobId] = frozenset()


class LoopObserver:
    """Called by the control loop after every step; everything here is cheap (dictionary copies and counts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.view = LoopView()
        self.backend: object | None = None  # the loop's executor, asked who runs GPU processes
        self.table: NodeTable | None = None  # a copy of the loop's node table, taken when it changed
        self._table_clock = -1
        self._table_of: NodeTable | None = None
        self._seen_started: set[JobId] = set()
        self.wait_counts: dict[str, list[int]] = {}  # per queue, per bucket of WAIT_BUCKETS_S (+Inf last)
        self.wait_sums: dict[str, float] = {}
        self.preemptions: dict[str, int] = {}
        self.cycles = 0
        self.cycle_seconds = 0.0
        self.last_cycle_seconds: float | None = None

    def after_step(self, reconciler: Reconciler, report: StepReport, now: float) -> None:
        cycles, core_seconds = report.cycles, report.core_seconds
        self.backend = reconciler.backend
        pending = dict(reconciler.pending.jobs)
        base = reconciler.base
        holdings: dict[JobId, Holding] = dict(base.holdings)
        stopping = frozenset(base.evicting)
        previous = self.view.holdings
        with self._lock:
            for job_id in previous.keys() - holdings.keys():
                if job_id in pending:  # held resources, now waits again: preempted, reclaimed or requeued
                    queue = pending[job_id].queue
                    self.preemptions[queue] = self.preemptions.get(queue, 0) + 1
            for job_id, holding in holdings.items():
                if job_id in previous or job_id in self._seen_started:
                    continue
                self._seen_started.add(job_id)
                started = holding.running.started_at if holding.running is not None else now
                self._observe_wait(holding.job.queue, max(0.0, started - holding.job.submitted_at))
            if len(self._seen_started) > 2 * (len(pending) + len(holdings)) + 1000:
                self._seen_started &= pending.keys() | holdings.keys()
            self.cycles += cycles
            self.cycle_seconds += core_seconds
            if cycles:
                self.last_cycle_seconds = core_seconds / cycles
            self.view = LoopView(now, pending, holdings, stopping)
            if base.table.clock != self._table_clock or base.table is not self._table_of:
                self._table_of = base.table
                self._table_clock = base.table.clock
                self.table = base.table.copy()

    def _observe_wait(self, queue: str, wait_s: float) -> None:
        counts = self.wait_counts.setdefault(queue, [0] * (len(WAIT_BUCKETS_S) + 1))
        index = next((i for i, bound in enumerate(WAIT_BUCKETS_S) if wait_s <= bound), len(WAIT_BUCKETS_S))
        counts[index] += 1
        self.wait_sums[queue] = self.wait_sums.get(queue, 0.0) + wait_s

    def wait_histogram(self, queue: str) -> WaitHistogram:
        with self._lock:
            counts = list(self.wait_counts.get(queue, [0] * (len(WAIT_BUCKETS_S) + 1)))
            total = self.wait_sums.get(queue, 0.0)
        cumulative, running = [], 0
        for bound, n in zip(WAIT_BUCKETS_S, counts, strict=False):
            running += n
            cumulative.append((bound, running))
        return WaitHistogram(tuple(cumulative), sum(counts), total)


# ----------------------------------------------------------------------------------- telemetry side


def declared_activity(job: Job) -> ActivityLevel:
    env = dict(job.run.env) if job.run is not None else {}
    value = env.get(ACTIVITY_ENV, "").strip().lower()
    if not value:
        return ActivityLevel.BUSY
    try:
        return ActivityLevel(value)
    except ValueError:
        return ActivityLevel.BUSY


def holders_of(view: LoopView) -> dict[GpuKey, list[Holder]]:
    """Who holds each GPU, from the loop's holdings (several jobs on a GPU shared in fractions)."""
    out: dict[GpuKey, list[Holder]] = {}
    for job_id, holding in view.holdings.items():
        job = holding.job
        since = holding.running.started_at if holding.running is not None else view.at
        for worker in holding.workers:
            for share in worker.gpus:
                out.setdefault((worker.node, share.index), []).append(
                    Holder(job_id, job.queue, share.milli, since, job.preemptible, job_id in view.stopping)
                )
    return out


def owner_of(on_gpu: Sequence[Holder]) -> GpuOwner:
    """The job named on a GPU's series: the largest share (ties: the smallest job id)."""
    best = min(on_gpu, key=lambda h: (-h.milli, h.job))
    return GpuOwner(best.job, best.queue)


@dataclass(frozen=True)
class TickState:
    """What the last tick computed; replaced whole, so readers on other threads see one tick's values."""

    at: float | None = None
    holders: Mapping[GpuKey, Sequence[Holder]] = field(default_factory=dict)
    utils: Mapping[GpuKey, float | None] = field(default_factory=dict)
    used_by_queue: Mapping[str, float] = field(default_factory=dict)
    idle_by_queue: Mapping[str, float] = field(default_factory=dict)
    fragmentation: tuple[float, float] | None = None  # (ratio, GPUs)
    processes_attributed: bool = False  # False: no executor to ask, the two below say nothing
    job_memory: Mapping[GpuKey, tuple[JobGpuMemory, ...]] = field(default_factory=dict)
    unattributed: Mapping[GpuKey, UnattributedMemory] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetPoint:
    """The whole fleet at one tick, in GPUs: what jobs hold, what they use (utilisation-weighted), what they
    hold but leave idle (flagged), and what nobody holds."""

    at: float
    capacity: float
    allocated: float
    used: float
    reserved_idle: float

    @property
    def free(self) -> float:
        return max(0.0, self.capacity - self.allocated)


class Telemetry:
    """Sampling, idle detection, usage and `/metrics` for one control plane."""

    def __init__(
        self,
        store: AdminStore,
        nodes: Sequence[Node],
        *,
        emulated: bool,
        hostname: str,
        settings: TelemetrySettings | None = None,
        wake: Callable[[], None] = lambda: None,
        probe: GpuProbe | None = None,
        clock: Callable[[], float] = time.time,
        processes: JobProcesses | None = None,
        target: TargetWorkload = GENERIC_TARGET,
        make_probe: ProbeFactory | None = None,
    ) -> None:
        """`make_probe`: builds the probe from the emulated activity and pid weights this telemetry keeps
        (a probe that samples through node agents); default: NVML, or the emulated probe on an emulated
        inventory."""
        self.store = store
        self.target = target  # FGD's target workload: the fragmentation metric measures against the scheduler's
        self.processes = processes  # None: the loop's executor, once the loop has stepped
        self.nodes = tuple(nodes)
        self.emulated = emulated
        self.settings = settings or TelemetrySettings()
        self.wake = wake
        self.clock = clock
        self.observer = LoopObserver()
        self._activity: dict[GpuKey, GpuActivity] = {}
        self._pid_weights: dict[int, int] = {}
        self._logged_strangers: set[tuple[str, int]] = set()
        if probe is None and make_probe is not None:
            probe = make_probe(lambda: self._activity, lambda: self._pid_weights)
        self.probe: GpuProbe = probe or self._make_probe(hostname)
        s = self.settings
        self.sampler = Sampler(self.probe, SampleRing(s.ring_length), interval_s=s.interval_s, clock=clock)
        self.detector = IdleDetector(s.idle_threshold_pct, s.idle_window_s, max_gap_s=3 * s.interval_s)
        self.book = UsageBook(store)
        self.cost = CostMeter(store)
        # Where queues stand against their budgets, for /metrics (the control plane sets it).
        self.budget_statuses: Callable[[], Mapping[str, BudgetStatus]] = dict
        self.spot_pools: Callable[[], Sequence[PoolStatus]] = list  # the spot breakers, for /metrics
        self.state = TickState()
        # The fleet's totals per tick, as long as the ring keeps samples (an hour at 5 s): the dashboard's chart.
        self.history: deque[FleetPoint] = deque(maxlen=s.ring_length)
        self.registry = make_registry(self.sampler, self)
        self.metrics = metrics_endpoint(self.registry)
        self.tick_seconds = 0.0
        self.ticks = 0
        self._last_flush = clock()
        self._frag_clock: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick_lock = threading.Lock()

    def _make_probe(self, hostname: str) -> GpuProbe:
        if self.emulated:
            return EmulatedProbe(self.nodes, lambda: self._activity, pid_weights=lambda: self._pid_weights)
        from gpufleet.adapters.nvml import NvmlProbe

        return NvmlProbe(hostname)

    # --- thread --------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpufleet-telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        try:
            self.book.flush()
        except Exception:  # the store may already be gone at exit; losing < one flush of usage is acceptable
            log.exception("telemetry: could not store the last usage figures")
        close = getattr(self.probe, "close", None)
        if callable(close):
            close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except StoreUnavailableError as error:  # a full disk, a database down: one line, not a traceback
                log.warning("telemetry: %s; retrying at the next interval", error.message)
            except Exception:  # telemetry must never take the control plane down
                log.exception("telemetry tick failed; retrying at the next interval")
            self._stop.wait(max(0.0, self.settings.interval_s - (time.monotonic() - started)))

    # --- one tick -------------------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> TickState:
        with self._tick_lock:
            started = time.perf_counter()
            at = self.clock() if now is None else now
            view = self.observer.view
            holders = holders_of(view)
            if self.emulated:
                self._activity = self._emulated_activity(view, holders)
            samples = self.sampler.tick(at)
            attributed, job_memory, unattributed = self._attribute(view, samples)
            utils: dict[GpuKey, float | None] = {s.key: s.gpu_util for s in samples}
            result = self.detector.update(at, holders, utils)
            self.book.add(at, result.usage)
            self.cost.add(at, view.holdings.values(), {n.name: n for n in self.nodes})
            for flag in result.flagged:
                self._act(flag, at)
            self.state = TickState(
                at, holders, utils, self._used_by_queue(holders, utils), self._idle_by_queue(holders),
                self._fragmentation(), attributed, job_memory, unattributed,
            )  # fmt: skip
            self.history.append(self._fleet_point(at, holders))
            if at - self._last_flush >= self.settings.flush_interval_s:
                self._last_flush = at
                self.book.flush()
            self.tick_seconds += time.perf_counter() - started
            self.ticks += 1
            return self.state

    def _emulated_activity(
        self, view: LoopView, holders: Mapping[GpuKey, Sequence[Holder]]
    ) -> dict[GpuKey, GpuActivity]:
        """Per GPU: the busiest level its jobs declare, for their summed share (the probe models one load)."""
        order = {ActivityLevel.IDLE: 0, ActivityLevel.LIGHT: 1, ActivityLevel.BUSY: 2}
        pids_on, self._pid_weights = self._worker_pids(view)
        out: dict[GpuKey, GpuActivity] = {}
        for key, on_gpu in holders.items():
            levels = []
            for holder in on_gpu:
                holding = view.holdings.get(holder.job)
                levels.append(declared_activity(holding.job) if holding is not None else ActivityLevel.BUSY)
            level = max(levels, key=order.__getitem__)
            milli = min(1000, sum(h.milli for h in on_gpu))
            out[key] = GpuActivity(owner_of(on_gpu).job, level, milli, pids=tuple(pids_on.get(key, ())))
        return out

    def _worker_pids(self, view: LoopView) -> tuple[dict[GpuKey, list[int]], dict[int, int]]:
        """For emulated GPUs: the pid of each running worker's command on each GPU it holds, and each pid's
        weight (its share of that GPU in milli-GPU), from the executor."""
        resolver = self._resolver()
        if resolver is None:
            return {}, {}
        commands: dict[tuple[str, int], tuple[int, int]] = {}  # (job, rank) -> (attempt, pid): newest attempt
        for (job, attempt, rank), pid in resolver.running_commands().items():
            if (job, rank) not in commands or commands[(job, rank)][0] < attempt:
                commands[(job, rank)] = (attempt, pid)
        pids: dict[GpuKey, list[int]] = {}
        weights: dict[int, int] = {}
        for job_id, holding in view.holdings.items():
            for rank, worker in enumerate(holding.workers):
                found = commands.get((job_id, rank))
                if found is None:
                    continue
                for share in worker.gpus:
                    pids.setdefault((worker.node, share.index), []).append(found[1])
                    weights[found[1]] = share.milli
        return pids, weights

    # --- GPU processes -> jobs --------------------------------------------------------------------------

    def _resolver(self) -> JobProcesses | None:
        if self.processes is not None:
            return self.processes
        backend = self.observer.backend
        if callable(getattr(backend, "owner_of", None)) and callable(getattr(backend, "running_commands", None)):
            return backend  # type: ignore[return-value]
        return None

    def _attribute(
        self, view: LoopView, samples: Sequence[GpuSample]
    ) -> tuple[bool, dict[GpuKey, tuple[JobGpuMemory, ...]], dict[GpuKey, UnattributedMemory]]:
        """Per GPU: each job's memory (its processes' summed) against its share, and what no job uses."""
        resolver = self._resolver()
        if resolver is None:
            return False, {}, {}
        pids = {pid for sample in samples for pid, _ in sample.processes}
        owners = resolver.owner_of(pids) if pids else {}
        job_memory: dict[GpuKey, tuple[JobGpuMemory, ...]] = {}
        unattributed: dict[GpuKey, UnattributedMemory] = {}
        strangers_now: set[tuple[str, int]] = set()
        for sample in samples:
            per_job: dict[str, tuple[int, list[int]]] = {}
            stray_bytes, stray_pids = 0, []
            for pid, used in sample.processes:
                owner = owners.get(pid)
                if owner is None:
                    stray_bytes += used
                    stray_pids.append(pid)
                    continue
                total, of_job = per_job.get(owner[0], (0, []))
                of_job.append(pid)
                per_job[owner[0]] = (total + used, of_job)
            unattributed[sample.key] = UnattributedMemory(
                sample.node, sample.index, sample.uuid, stray_bytes, tuple(stray_pids)
            )
            if per_job:
                job_memory[sample.key] = tuple(
                    JobGpuMemory(
                        job,
                        _queue_of(view, job),
                        sample.node,
                        sample.index,
                        sample.uuid,
                        used,
                        self._share_bytes(view, job, sample),
                        tuple(sorted(of_job)),
                    )
                    for job, (used, of_job) in sorted(per_job.items())
                )
            for pid, used in sample.processes:
                if pid in owners:
                    continue
                strangers_now.add((sample.node, pid))
                if (sample.node, pid) not in self._logged_strangers:
                    log.warning(
                        "GPU %s on %s: process %d uses %d MiB of GPU memory and belongs to no gpufleet job "
                        "(the GPU is used outside the scheduler)",
                        sample.index, sample.node, pid, used // 2**20,
                    )  # fmt: skip
        # Remember only processes still there: one that comes back with a reused pid is logged again.
        self._logged_strangers = set(list(strangers_now)[:_LOGGED_STRANGERS_MAX])
        return True, job_memory, unattributed

    def _share_bytes(self, view: LoopView, job: str, sample: GpuSample) -> int:
        """What the job's hold on this GPU entitles it to: the memory its shares reserved, else its fraction of
        the GPU's memory; 0 when it holds no share of this GPU."""
        holding = view.holdings.get(job)
        if holding is None:
            return 0
        total_memory = sample.memory_total or self._gpu_memory(sample.key)
        out = 0
        for worker in holding.workers:
            if worker.node != sample.node:
                continue
            for share in worker.gpus:
                if share.index == sample.index:
                    out += share.memory if share.memory > 0 else total_memory * share.milli // 1000
        return out

    def _gpu_memory(self, key: GpuKey) -> int:
        for node in self.nodes:
            if node.name == key[0]:
                for gpu in node.gpus:
                    if gpu.index == key[1]:
                        return gpu.memory
        return 0

    def _used_by_queue(
        self, holders: Mapping[GpuKey, Sequence[Holder]], utils: Mapping[GpuKey, float | None]
    ) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, on_gpu in holders.items():
            util = utils.get(key)
            if util is None:
                continue
            total = sum(h.milli for h in on_gpu) or 1
            for holder in on_gpu:
                used = min(holder.milli / 1000.0, util / 100.0 * holder.milli / total)
                out[holder.queue] = out.get(holder.queue, 0.0) + used
        return out

    def _fleet_point(self, at: float, holders: Mapping[GpuKey, Sequence[Holder]]) -> FleetPoint:
        state = self.state
        return FleetPoint(
            at=at,
            capacity=float(sum(len(node.gpus) for node in self.nodes)),
            allocated=sum(min(1000, sum(h.milli for h in on_gpu)) for on_gpu in holders.values()) / 1000.0,
            used=sum(state.used_by_queue.values()),
            reserved_idle=sum(state.idle_by_queue.values()),
        )

    def _idle_by_queue(self, holders: Mapping[GpuKey, Sequence[Holder]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, on_gpu in holders.items():
            if self.detector.gpu_flagged(key):
                for holder in on_gpu:
                    out[holder.queue] = out.get(holder.queue, 0.0) + holder.milli / 1000.0
        return out

    def _fragmentation(self) -> tuple[float, float] | None:
        table = self.observer.table
        if table is None:
            return None
        marker = (id(table), table.clock)
        if marker == self._frag_clock and self.state.fragmentation is not None:
            return self.state.fragmentation
        summary = cluster_fragmentation(table, self.target)
        self._frag_clock = marker
        return (summary.ratio, summary.fragmented_milli / 1000.0)

    # --- idle policy -----------------------------------------------------------------------------------

    def _act(self, flag: IdleFlag, now: float) -> None:
        policy = idle_policy(self.store, flag.queue)
        idle_for = now - flag.idle_since
        what = (
            f"reserved but idle: {flag.gpu_milli / 1000:g} GPU(s) under {self.settings.idle_threshold_pct:g} % "
            f"utilisation for {idle_for:.0f} s (window {self.settings.idle_window_s:g} s)"
        )
        if policy is IdlePolicy.RECLAIM and flag.preemptible:
            self.store.request(flag.job, RequestKind.RECLAIM, what, now)
            action = "reclaim requested: requeued with its checkpoint signal"
            self.wake()
        elif policy is IdlePolicy.RECLAIM:
            action = "not reclaimed: the job is not preemptible"
        else:
            action = "notified" if policy is IdlePolicy.NOTIFY else "no action (policy none)"
        if policy is not IdlePolicy.NONE:
            log.warning("job %s (queue %s) %s; policy %s: %s", flag.job, flag.queue, what, policy.value, action)
        record = {
            "flagged_at": flag.flagged_at,
            "idle_since": flag.idle_since,
            "attempt_started_at": flag.since,
            "gpus": [list(key) for key in flag.gpus],
            "policy": policy.value,
            "action": action,
            "reason": what,
        }
        self.store.set_setting(FLAG_KEY.format(job=flag.job), json.dumps(record, sort_keys=True))
        if policy is not IdlePolicy.NONE:
            self.store.add_notice(Notice(flag.job, "reserved-idle", f"{what}; policy {policy.value}: {action}", now))

    def last_flag(self, job: str) -> dict[str, object] | None:
        text = self.store.get_setting(FLAG_KEY.format(job=job))
        if not text:
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    # --- what scrapes read ------------------------------------------------------------------------------

    def latest_samples(self) -> list[GpuSample]:
        return self.sampler.latest_samples()

    def scheduler_state(self) -> SchedulerState:
        """For `/metrics`: from the loop's last publication and the last tick; no store access."""
        obs = self.observer
        view = obs.view
        tick = self.state
        pending: dict[str, int] = {}
        for job in view.pending.values():
            pending[job.queue] = pending.get(job.queue, 0) + 1
        running: dict[str, int] = {}
        allocated: dict[str, float] = {}
        for holding in view.holdings.values():
            queue = holding.job.queue
            running[queue] = running.get(queue, 0) + 1
            milli = sum(share.milli for worker in holding.workers for share in worker.gpus)
            allocated[queue] = allocated.get(queue, 0.0) + milli / 1000.0
        owners = {key: owner_of(on_gpu) for key, on_gpu in tick.holders.items() if on_gpu}
        since_start = dict(self.book.since_start)
        names = set(pending) | set(running) | set(obs.wait_counts) | set(obs.preemptions) | set(since_start)
        queues = tuple(
            QueueMetrics(
                queue=name,
                pending=pending.get(name, 0),
                running=running.get(name, 0),
                wait=obs.wait_histogram(name),
                allocated_gpus=allocated.get(name, 0.0),
                used_gpus=tick.used_by_queue.get(name, 0.0),
                reserved_idle_gpus=tick.idle_by_queue.get(name, 0.0),
                reserved_idle_gpu_seconds=since_start[name].idle if name in since_start else 0.0,
                preemptions=obs.preemptions.get(name, 0),
            )
            for name in sorted(names)
        )
        frag = tick.fragmentation
        return SchedulerState(
            queues=queues,
            owners=owners,
            fragmentation_ratio=frag[0] if frag else None,
            fragmented_gpus=frag[1] if frag else None,
            cycles=obs.cycles,
            cycle_seconds_sum=obs.cycle_seconds,
            last_cycle_seconds=obs.last_cycle_seconds,
            processes_attributed=tick.processes_attributed,
            job_memory=tuple(m for key in sorted(tick.job_memory) for m in tick.job_memory[key]),
            unattributed=tuple(tick.unattributed[key] for key in sorted(tick.unattributed)),
            costs=tuple(CostCounter(*key, usd) for key, usd in sorted(self.cost.totals().items())),
            budgets=tuple(
                BudgetGauge(queue, s.fraction, BUDGET_LEVELS[s.level])
                for queue, s in sorted(self.budget_statuses().items())
            ),
            spot_pools=tuple(
                SpotPoolGauge(p.pool, STATE_CODES[BreakerState(p.state)], p.rate_per_node_hour, p.interruptions_total)
                for p in self.spot_pools()
            ),
        )

    def job_memory(self, job: str) -> list[JobGpuMemory]:
        """The job's GPU memory per GPU at the last tick (GPUs where its processes use none are left out)."""
        return [m for key in sorted(self.state.job_memory) for m in self.state.job_memory[key] if m.job == job]


def _queue_of(view: LoopView, job: str) -> str:
    holding = view.holdings.get(job)
    if holding is not None:
        return holding.job.queue
    pending = view.pending.get(job)
    return pending.queue if pending is not None else ""
