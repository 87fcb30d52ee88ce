"""`Reconciler.step()`: observe -> snapshot -> decide -> apply. The one control loop of gpufleet.

The same class runs live (wall clock, a real backend, a database) and in the simulator (simulated
clock and backend, in-memory store): only the ports passed in differ.

- Observe: what the backend reports (started, exited, stopped, lost) becomes transitions; so do the
  users' requests (cancel, requeue) and attempts that ran past their max runtime.
- Snapshot: a working state is kept in step with the store and forked for each cycle (`LoopState`).
- Decide: the pure core (`decide`) on the jobs that need a decision now (see `PendingIndex`), with what
  the profile's learner estimated for them as data (`Learning`).
- Apply: first the intents are written (placements as Launching, victims as Evicting) in one
  short write with version checks, then, outside it, the backend is asked to launch and stop.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

from gpufleet.control import holds
from gpufleet.control.changes import (
    Changes,
    attained_until,
    attempt_loss,
    back_to_queue,
    collapse,
)
from gpufleet.control.collector import LongLivedObjects
from gpufleet.control.learning import Learning
from gpufleet.control.loop_state import LoopState
from gpufleet.control.outcomes import exited, stopped
from gpufleet.control.pending import PendingIndex
from gpufleet.control.resize import ProgressReader, Resizer, kept_on_densest
from gpufleet.control.resume import resume_intents
from gpufleet.control.throughput_learner import ThroughputLearner
from gpufleet.domain.checkpoints import LossCause, ObservedPool, plan_checkpoints
from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.records import JobRecord, StopCause
from gpufleet.domain.snapshot import ClusterSnapshot
from gpufleet.domain.throughput_table import ThroughputTable
from gpufleet.domain.windows import Window
from gpufleet.ports import (
    Clock,
    EventSink,
    ExecutionBackend,
    Launch,
    Observation,
    ObservationKind,
    Request,
    RequestKind,
    StaleWriteError,
    StateStore,
)
from gpufleet.scheduling.cycle import CycleResult, collector_paused, decide
from gpufleet.scheduling.plugin_api import Profile, SortKey, Wake
from gpufleet.scheduling.state import InventoryCache

S = JobState
ROUND_BURST = 1 << 30  # with rounds, every job of an active group is decided
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReconcilerSettings:
    grace_s: float = 30.0  # checkpoint grace period given to preemption victims
    # The longest grace any stop gives, unless the job's queue sets its own (`QueueSpec.max_grace_s`): a job
    # stored before a cap existed, or with a cap raised since, cannot hold its GPUs longer. None: no cap.
    max_grace_s: float | None = None
    retry_all_s: float = 300.0  # with preemption: retry every parked job this often (as Kubernetes does)
    max_cycles_per_step: int = 64
    # A waiting job's reason is rewritten when its code changes, else at most this often: the counts in a
    # reason ("0/1000 nodes fit: 700 too few free GPUs") change nearly every cycle, and writing every pending
    # job's record each step made two thirds of the store's writes under a steady load.
    reason_refresh_s: float = 10.0
    # How often the throughputs of job types are learned from their progress reports (`throughput_learner.py`);
    # None: never (the profile's table only). The live control plane learns; the simulator's jobs report no model.
    learn_throughput_s: float | None = None
    # Freeze what survives each step out of the cyclic collector's walks (`collector.py`): process-wide, so the
    # live control plane's choice; a loop embedded elsewhere (the simulator, a test) leaves the collector alone.
    freeze_long_lived: bool = False


@dataclass
class StepReport:
    placed: int = 0
    preempted: int = 0
    migrated: int = 0  # running jobs stopped to start again where their policy plans them (`Profile.migrate`)
    finished: int = 0
    stopped: int = 0  # cancels, requeues and timeouts asked of the backend
    observed: int = 0  # observations the backend reported
    cycles: int = 0
    decided: int = 0
    core_seconds: float = 0.0
    resized: int = 0  # resizes of running elastic jobs asked of the backend


class Reconciler:
    def __init__(
        self,
        store: StateStore,
        backend: ExecutionBackend,
        clock: Clock,
        profile: Profile,
        events: EventSink | None = None,
        settings: ReconcilerSettings | None = None,
        observed_pools: Callable[[], Mapping[str, ObservedPool]] = dict,
        throughput: ThroughputTable | None = None,
    ) -> None:
        """`observed_pools`: what each spot pool's breaker measured (interruptions per node-hour), for the
        checkpoint interval each launch is given (`domain/checkpoints.py`); live, the spot watch's.
        `throughput`: the table the profile was built with, which learned throughputs are merged into."""
        self.store = store
        self.backend = backend
        self.clock = clock
        self.profile = profile
        self.events = events
        self.settings = settings or ReconcilerSettings()
        self.long_lived = LongLivedObjects() if self.settings.freeze_long_lived else None
        self.observed_pools = observed_pools
        self._nodes: dict[str, Node] = {}
        self.pending = self._pending_index()
        self.gate = holds.gate_of(self)
        self.learning = Learning(profile.learner)
        self.inventory = InventoryCache()  # the node inventory's table and memo, kept across rebuilds
        self.nominated: set[JobId] = set()
        # Jobs with a start reserved by the last cycle (`Profile.reserve_after_s`): decided in every cycle, so that
        # their room is held whenever other jobs are placed.
        self.reserved: set[JobId] = set()
        self._windows: tuple[Window, ...] = ()
        self._next_window_stop: float | None = None  # when `_window_stops` will stop a job next
        self._window_phases: tuple[tuple[str, bool, bool], ...] = ()
        # Pending jobs by submission time, for the first to wait past `reserve_after_s` (a parked job is woken by
        # events that may let it in; crossing the threshold is not one of them). Entries of jobs no longer pending
        # are dropped when they reach the top.
        self._by_age: list[tuple[float, JobId]] = []
        self._cursor = 0
        self._request_cursor = 0
        self._cluster_version = -1
        self._last_retry_all = clock.now()
        self._next_round = self._round_after(clock.now())
        self._deadlines: list[tuple[float, JobId, int]] = []  # (max runtime end, job, attempt), a heap
        self._known: dict[JobId, JobRecord] = {}  # every active job's record as last read or written
        # What the backend reported and the store has not taken yet: the backend reports each observation
        # once, so one whose write failed is kept and written again, never dropped.
        self._unwritten: list[Observation] = []
        self._dirty = False
        self._reason_at: dict[JobId, float] = {}  # when each waiting job's reason was last written
        # Resizes of running elastic jobs (`control/resize.py`): only with a plugin and a backend that resizes.
        self.resizer = (
            Resizer(profile.resize, profile, store if isinstance(store, ProgressReader) else None)
            if profile.resize is not None and backend.capabilities.resize
            else None
        )
        self.throughput_learner = ThroughputLearner.of_store(throughput, store, self.settings.learn_throughput_s)
        self._rebuild()
        holding = [r for r in self.store.active() if r.holds_resources]
        self.adopted = len(holding)  # handed to the backend at start (one whose workers are gone is then LOST)
        self.backend.adopt([self._launch(r) for r in holding])
        resume_intents(self.backend, holding, self._launch, self._grace)

    # --- the loop -------------------------------------------------------------------------------

    def step(self) -> StepReport:
        """One pass of the loop. A step that fails (the store refused a write: disk full, database down)
        raises after keeping what it observed; the next step first resynchronises its working state from
        the store, then writes those observations again."""
        report = StepReport()
        # The collector is paused for the whole step, not only for its cycles: observing, taking in and
        # writing also allocate objects that die within the step, and each collection the collector ran
        # among them walked them again, promoted those alive at that moment (and so brought the next
        # full collection of every job's objects closer). The young objects a step leaves are collected
        # once, when it ends.
        with collector_paused():
            self._step_or_resync(report)
        if self.long_lived is not None:
            self.long_lived.after_step()
        return report

    def _step_or_resync(self, report: StepReport) -> None:
        if self._dirty:
            self._resync()
        try:
            self._step(report)
        except StaleWriteError as error:
            # Another writer changed a job under us (a second control plane on the same store, or a
            # bug). Nothing was launched for the rejected write: resynchronise from the store.
            log.warning("store changed under the control loop (%s); resynchronising", error)
            self._resync()
        except Exception:
            # Working state may hold changes the store never took (placements, removals): rebuild it.
            self._dirty = True
            raise

    def _resync(self) -> None:
        self.pending = self._pending_index()
        self.gate = holds.gate_of(self)
        self.nominated.clear()
        self.reserved.clear()
        self._by_age.clear()
        self._rebuild()
        self._dirty = False

    def _step(self, report: StepReport) -> None:
        now = self.clock.now()
        if self.store.cluster_version() != self._cluster_version:
            self._rebuild()
            self.pending.wake_all()
        # Order plugins key new and requeued jobs against the base state: it must read this step's time.
        self.base.set_now(now)
        requests, cursor = self.store.take_requests(self._request_cursor)
        # Checkpoints first: a job that saved on its stop signal reported it before the stop is observed.
        self._checkpoints(requests)
        self._observe(now, report)
        self._intake(now)
        self._requests(now, report, requests)
        self._request_cursor = cursor  # taken only once acted on: a failed step reads them again
        self._timeouts(now, report)
        self._window_stops(now, report)
        phases = tuple((w.name, now >= w.start, now >= w.end) for w in self._windows)
        if phases != self._window_phases:
            # A window began or ended: what it held is free for other jobs now, or no longer free for them.
            self._window_phases = phases
            self.pending.wake_all()
        holds.release_dependents(self, now)
        if self.throughput_learner is not None and self.throughput_learner.due(now):
            holding = (self._known[job_id] for job_id in self.base.holdings if job_id in self._known)
            table = self.throughput_learner.learn(now, holding)
            if table is not None:
                self.base.set_throughput(table)
        if self.profile.preempt is not None and now >= self._last_retry_all + self.settings.retry_all_s:
            self.pending.wake_all()
            self._last_retry_all = now
        round_begins = self._next_round is not None and now >= self._next_round
        if round_begins:
            # A round begins: every pending job is decided again against the round's plan.
            self.pending.wake_all()
            self._next_round = self._round_after(now)
        # A profile that moves running jobs plans every round, even when nobody waits (a job on a slow GPU
        # while a faster one is idle): one cycle then decides no job and asks only for its moves.
        plan_moves = round_begins and self.profile.migrate is not None
        for _ in range(self.settings.max_cycles_per_step):
            jobs = self.pending.to_decide(self.nominated | self.reserved | self._aged(now))
            if not jobs and not plan_moves:
                break
            plan_moves = False
            started = time.perf_counter()
            work = self.base.fork(now)
            work.queued = tuple(self.pending.jobs.values())
            result = decide(work, jobs, self.profile, sorted(self.nominated))
            self.reserved = {reservation.job for reservation in result.reserved_starts}
            report.core_seconds += time.perf_counter() - started
            report.cycles += 1
            report.decided += len(jobs)
            self._apply(now, result, report)
            self.base.keep_from(work)
            if not self.pending.settle(jobs, result.waiting):
                break
        self._resize(now, report)

    def stop_everything(self, reason: str) -> int:
        """Stop every job that holds resources and put it back in its queue (the control plane is
        going down and was asked to stop its jobs). Returns how many were asked to stop."""
        now = self.clock.now()
        changes = Changes()
        stops = [
            self._stop(record, StopCause.PREEMPTED, reason, now, changes)
            for record in self.store.active()
            if record.state in (S.RUNNING, S.LAUNCHING)
        ]
        self._write(changes)
        report = StepReport()
        self._send_stops(stops, report)
        return report.stopped

    def observe(self) -> StepReport:
        """Record what the backend observed, and decide nothing (used while shutting down)."""
        report = StepReport()
        self._observe(self.clock.now(), report)
        return report

    def next_retry_at(self) -> float | None:
        """When parked jobs will be retried regardless of events (None: only events wake them): the next
        round boundary for a profile that allocates in rounds while jobs wait (always, for one that moves running
        jobs), else the periodic retry."""
        if self._next_round is not None and (len(self.pending) or self.profile.migrate is not None):
            return self._next_round
        retry = None
        if self.profile.preempt is not None and self.pending.parked:
            retry = self._last_retry_all + self.settings.retry_all_s
        if self.resizer is not None and self.resizer.active:
            at = self.resizer.next_at(self.clock.now())
            retry = at if retry is None else min(retry, at)
        now = self.clock.now()
        after = self.profile.reserve_after_s
        oldest = self._oldest_pending() if after is not None else None
        times = [oldest[0] + after] if after is not None and oldest is not None else []
        # A window's bounds (jobs may start on its nodes again), and the next stop one makes due.
        for window in self._windows:
            times += [window.start, window.end] if not window.over(now) else []
        if self._next_window_stop is not None:
            times.append(self._next_window_stop)
        upcoming = [t for t in times if t > now]
        if upcoming:
            retry = min(upcoming) if retry is None else min(retry, *upcoming)
        return retry

    def _pending_index(self) -> PendingIndex:
        # A profile that allocates in rounds plans over every waiting job: decide them all, not a burst.
        if self.profile.round_s is not None:
            return PendingIndex(self.profile.strict_fifo, burst=ROUND_BURST)
        return PendingIndex(self.profile.strict_fifo)

    def _admit(self, record: JobRecord, now: float) -> None:
        """A pending job the loop has not seen: to the scheduler, unless the dependency gate keeps it."""
        if self.gate.admit(record.job):
            self._add_pending(record.as_pending(), now)

    def _round_after(self, now: float) -> float | None:
        """The first round boundary after `now` (None: the profile does not allocate in rounds)."""
        length = self.profile.round_s
        if length is None:
            return None
        return (math.floor(now / length) + 1) * length

    # --- snapshot ---------------------------------------------------------------------------------

    def _rebuild(self) -> None:
        """The base state from the store (at start, and when nodes or queues change)."""
        self._cluster_version = self.store.cluster_version()
        if self._cursor == 0:
            # First build: every pending job is in `active()`; later submissions come through the cursor.
            self._cursor = self.store.submission_cursor()
        records = self.store.active()
        running = tuple(r.as_running() for r in records if r.holds_resources)
        now = self.clock.now()
        nodes = self.store.nodes()
        self._nodes = {node.name: node for node in nodes}
        self._windows = self.store.windows()
        snapshot = ClusterSnapshot(nodes, running, self.store.queues(), now=now, windows=self._windows)
        learned = self.throughput_learner.table if self.throughput_learner is not None else None
        self.base = LoopState(snapshot, self.inventory, self.learning.estimates, learned)
        self._deadlines = []
        self._known = {record.id: record for record in records}
        for run in running:
            self.learning.started(run)
        self.gate.holding(r for r in records if r.holds_resources)
        for record in records:
            if record.state is S.PENDING and record.id not in self.pending and record.id not in self.gate:
                self._admit(record, now)
            elif record.holds_resources:
                self._track_deadline(record)

    def _track_deadline(self, record: JobRecord) -> None:
        run = record.job.run
        if run is not None and run.max_runtime_s is not None and record.started_at is not None:
            heapq.heappush(self._deadlines, (record.started_at + run.max_runtime_s, record.id, record.attempt))

    def _add_pending(self, job: Job, now: float) -> None:
        """A job becomes pending: the learner estimates it, the order keys it against the base state."""
        self.learning.pending(job, now)
        key: SortKey = self.profile.order.job_key(job, self.base.view)
        self.pending.add(job, key)
        if self.profile.reserve_after_s is not None:
            heapq.heappush(self._by_age, (job.submitted_at, job.id))

    def _oldest_pending(self) -> tuple[float, JobId] | None:
        heap = self._by_age
        while heap and heap[0][1] not in self.pending:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _aged(self, now: float) -> set[JobId]:
        """The job that has waited longest, once past `reserve_after_s`: decided every cycle, parked or not, so that
        the cycle may reserve its start (`Profile.reserve_after_s`)."""
        after = self.profile.reserve_after_s
        oldest = self._oldest_pending() if after is not None else None
        if after is None or oldest is None or oldest[0] > now - after:
            return set()
        return {oldest[1]}

    def _intake(self, now: float) -> None:
        submitted, self._cursor = self.store.take_submissions(self._cursor)
        for record in submitted:
            self._known.setdefault(record.id, record)
            if record.state is S.PENDING and record.id not in self.pending and record.id not in self.gate:
                self._admit(record, now)

    # --- requests and timeouts ---------------------------------------------------------------------

    def _checkpoints(self, requests: Sequence[Request]) -> None:
        """Checkpoints jobs reported (through the API's report channel): each one's time and cost go into its
        record, and the time into the running job the core ranks victims by (work lost since it)."""
        changes = Changes()
        for request in requests:
            if request.kind is not RequestKind.CHECKPOINT:
                continue
            record = self._latest(request.job_id, changes)
            if record is None or record.state.terminal:
                continue
            update: dict[str, object] = {}
            if request.value is not None:
                update["checkpoint_cost_s"] = request.value
            if record.last_checkpoint_at is None or request.at > record.last_checkpoint_at:
                update["last_checkpoint_at"] = request.at
            if update:
                changes.add(record.evolve(**update))
        self._write(changes)
        for record in changes.latest.values():
            if record.holds_resources and record.last_checkpoint_at is not None and record.id in self.base.holdings:
                self.base.set_checkpoint(record.id, record.last_checkpoint_at)

    def _requests(self, now: float, report: StepReport, requests: Sequence[Request]) -> None:
        if not requests:
            return
        changes = Changes()
        stops: list[JobRecord] = []
        killed: set[JobId] = set()
        readmit: list[JobId] = []
        for request in requests:
            record = self._latest(request.job_id, changes)
            if record is None or record.state.terminal:
                continue
            if request.kind is RequestKind.CANCEL:
                self._cancel(record, request, now, changes, stops)
            elif request.kind is RequestKind.FORCE_CANCEL:
                self._cancel(record, request, now, changes, stops, force=True)
                killed.add(record.id)
            elif request.kind is RequestKind.REQUEUE and self._requeue_applies(record, request):
                stops.append(self._stop(record, StopCause.PREEMPTED, f"requeued: {request.reason}", now, changes))
            elif request.kind is RequestKind.RECLAIM and self._requeue_applies(record, request):
                stops.append(self._stop(record, StopCause.RECLAIMED, f"reclaimed: {request.reason}", now, changes))
            elif request.kind in holds.KINDS and holds.apply(self, record, request, now, changes):
                readmit.append(record.id)
        self._write(changes)
        for job_id in readmit:
            if (record := self._known.get(job_id)) is not None and record.state is S.PENDING:
                self._admit(record, now)
        self._send_stops(stops, report, killed)

    @staticmethod
    def _requeue_applies(record: JobRecord, request: Request) -> bool:
        # Requests are replayed after a restart: only one made after this attempt started applies.
        return (
            record.state in (S.RUNNING, S.LAUNCHING)
            and record.started_at is not None
            and request.at >= record.started_at
        )

    def _cancel(
        self,
        record: JobRecord,
        request: Request,
        now: float,
        changes: Changes,
        stops: list[JobRecord],
        *,
        force: bool = False,
    ) -> None:
        what = "force-cancelled (killed at once, without its grace period)" if force else "cancelled"
        reason = f"{what}: {request.reason}" if request.reason else what
        if record.state in (S.PENDING, S.HELD):
            changes.move(record, S.CANCELLED, reason, now, finished_at=now)
            self._reason_at.pop(record.id, None)
            self.pending.remove(record.id)
            self.gate.remove(record.id)
            self.nominated.discard(record.id)
        elif record.state in (S.RUNNING, S.LAUNCHING):
            stops.append(self._stop(record, StopCause.CANCELLED, reason, now, changes))
        elif record.state is S.EVICTING and (force or record.stop_cause is not StopCause.CANCELLED):
            # Already stopping (preempted, or cancelled with a grace period): once stopped it ends cancelled
            # instead of going back; forced, it is killed now rather than when its grace runs out.
            stopping = record.evolve(stop_cause=StopCause.CANCELLED, reason=reason)
            changes.add(stopping)
            if force:
                stops.append(stopping)

    def _timeouts(self, now: float, report: StepReport) -> None:
        if not self._deadlines or self._deadlines[0][0] > now:
            return
        changes = Changes()
        stops: list[JobRecord] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, job_id, attempt = heapq.heappop(self._deadlines)
            record = self._latest(job_id, changes)
            if record is None or record.attempt != attempt or record.state not in (S.RUNNING, S.LAUNCHING):
                continue
            limit = record.job.run.max_runtime_s if record.job.run is not None else None
            reason = f"ran past its max runtime of {limit:g} s"
            stops.append(self._stop(record, StopCause.TIMEOUT, reason, now, changes))
        self._write(changes)
        self._send_stops(stops, report)

    def _window_stops(self, now: float, report: StepReport) -> None:
        """Stop the jobs an admin's window must not find running on its nodes (maintenance: every job; a queue's
        window: other queues' jobs), their grace period before it starts: they go back to their queue, and the
        cycle starts them again where the windows let them (`domain/windows.py`)."""
        open_windows = [w for w in self._windows if not w.over(now)]
        self._next_window_stop = None
        if not open_windows:
            return
        changes = Changes()
        stops: list[JobRecord] = []
        for job_id, holding in list(self.base.holdings.items()):
            if job_id in self.base.evicting:
                continue
            nodes = {worker.node for worker in holding.workers}
            for window in open_windows:
                if window.queue == holding.job.queue or not nodes.intersection(window.nodes):
                    continue
                record = self._latest(job_id, changes)
                if record is None or record.state not in (S.RUNNING, S.LAUNCHING):
                    break
                if window.ends_before(record.job, record.started_at or now):
                    continue  # as the cycle let it in for
                due = window.start - self._grace(record)
                if now < due:
                    self._next_window_stop = due if self._next_window_stop is None else min(self._next_window_stop, due)
                    continue
                reason = f"{window.describe()} on its node(s): stopped before it starts, back to its queue"
                stops.append(self._stop(record, StopCause.PREEMPTED, reason, now, changes))
                break
        self._write(changes)
        self._send_stops(stops, report)

    def _stop(self, record: JobRecord, cause: StopCause, reason: str, now: float, changes: Changes) -> JobRecord:
        evicting = changes.move(record, S.EVICTING, reason, now, stop_cause=cause, evicting_for=None)
        self.base.set_evicting(record.id, "")
        return evicting

    def _send_stops(self, stops: Sequence[JobRecord], report: StepReport, killed: Set[JobId] = frozenset()) -> None:
        for record in stops:
            grace = 0.0 if record.id in killed else self._grace(record)
            self.backend.stop(record.id, record.attempt, grace, record.reason)
            report.stopped += 1

    def _grace(self, record: JobRecord) -> float:
        run = record.job.run
        grace = run.grace_s if run is not None else self.settings.grace_s
        queue = self.base.queues.get(record.job.queue)
        most = queue.max_grace_s if queue is not None and queue.max_grace_s is not None else self.settings.max_grace_s
        return grace if most is None else min(grace, most)

    # --- observe ----------------------------------------------------------------------------------

    def _observe(self, now: float, report: StepReport) -> None:
        fresh = self.backend.poll()
        report.observed += len(fresh)
        observations = self._unwritten = [*self._unwritten, *fresh]
        if not observations:
            return
        changes = Changes()
        released_queues: set[str] = set()
        requeued: list[JobRecord] = []
        outcomes: list[tuple[JobRecord, Observation, JobRecord]] = []
        for obs in observations:
            record = self._current(obs, changes)
            if record is None:
                continue
            outcome = self._observed(record, obs, changes)
            if outcome is not None:
                outcomes.append((record, obs, outcome))
        self._write(changes)
        self._unwritten = []
        # Working state follows the store only once the store took the change.
        for record, obs, outcome in outcomes:
            if obs.kind is ObservationKind.RESIZED:
                self._resize_observed(record, outcome, released_queues)
                continue
            if not outcome.holds_resources and record.holds_resources:
                self.base.remove_running(record.id)
                # A run ended on its own when the job exited without having been asked to stop.
                finished = obs.kind is ObservationKind.EXITED and record.state is not S.EVICTING
                self.learning.ended(record.id, now, finished=finished)
                released_queues.add(record.job.queue)
                self.nominated.discard(record.id)
                if outcome.state is S.PENDING:
                    requeued.append(outcome)
                else:
                    report.finished += 1
        for record in requeued:
            self._add_pending(record.as_pending(), now)
        if released_queues:
            self.pending.wake(Wake.RELEASE)
            self.pending.wake(Wake.QUOTA, self._cohort_mates(released_queues))

    def _current(self, obs: Observation, changes: Changes) -> JobRecord | None:
        record = self._latest(obs.job_id, changes)
        if record is None or record.attempt != obs.attempt or record.state.terminal:
            return None  # stale: an earlier attempt, or already finished
        return record

    def _observed(self, record: JobRecord, obs: Observation, changes: Changes) -> JobRecord | None:
        at = obs.at
        checkpoint = obs.checkpoint_at if obs.checkpoint_at is not None else record.last_checkpoint_at
        if obs.kind is ObservationKind.STARTED:
            if record.state is S.LAUNCHING:
                return changes.move(record, S.RUNNING, "all workers started", at, started_at=at)
            return None
        attained = attained_until(record, at)
        if obs.kind is ObservationKind.RESIZED:
            return self._resized(record, obs, attained, changes)
        if obs.kind is ObservationKind.EXITED:
            if record.state not in (S.RUNNING, S.EVICTING, S.LAUNCHING):
                return None
            if record.state is S.LAUNCHING:
                record = changes.move(record, S.RUNNING, "all workers started", at, started_at=record.started_at)
            return exited(record, obs, attained, checkpoint, changes)
        if obs.kind is ObservationKind.STOPPED:
            if record.state is not S.EVICTING:
                return None
            return stopped(record, obs, attained, checkpoint, changes, self.store.submission_cursor)
        if obs.kind is ObservationKind.LOST and record.state in (S.RUNNING, S.LAUNCHING, S.EVICTING):
            if record.state is S.EVICTING and record.stop_cause in (StopCause.CANCELLED, StopCause.TIMEOUT):
                return stopped(record, obs, attained, checkpoint, changes, self.store.submission_cursor)
            what = "lost while being stopped" if record.state is S.EVICTING else "lost"
            reason = f"{what} ({obs.detail or 'no reason given'}); retried"
            preemptions = record.preemptions + (record.state is S.EVICTING)
            loss = attempt_loss(record, LossCause.LOST, at, checkpoint)
            return back_to_queue(changes, record, reason, at, attained, checkpoint, preemptions, attempt_loss=loss)
        return None

    def _resized(self, record: JobRecord, obs: Observation, attained: float, changes: Changes) -> JobRecord | None:
        """Every new worker of a resize is up: a shrink now holds only the workers it kept. A backend that
        restarted says an earlier resize again: only the one under way ends the mark."""
        if record.state is not S.RUNNING or not record.resizing:
            return None
        if obs.resize_count is not None and obs.resize_count != record.resizes:
            return None
        workers = record.resize_to or record.workers
        gpus = len(workers) * record.job.request.gpus
        reason = f"resized to {gpus} GPU(s) in {len(workers)} worker(s) (resize {record.resizes} of this job)"
        return changes.resize(
            record,
            reason,
            obs.at,
            workers=workers,
            resize_to=(),
            resizing=False,
            resized_at=obs.at,
            attained_gpu_seconds=attained,
        )

    def _resize_observed(self, record: JobRecord, outcome: JobRecord, released: set[str]) -> None:
        if outcome.workers != record.workers:
            self.base.remove_running(record.id)
            self.base.add_running(outcome.as_running())
            released.add(record.job.queue)
        if self.resizer is not None:
            self.resizer.record_size(outcome)

    def _resize(self, now: float, report: StepReport) -> None:
        """Ask the resize plugin for new sizes of running elastic jobs and start those resizes."""
        resizer = self.resizer
        if resizer is None or not resizer.due(now, len(self.pending.jobs)):
            return
        known = self._known
        running = [r for job_id in self.base.holdings if (r := known.get(job_id)) is not None and r.job.resizable]
        resizer.active = bool(running)
        if not running:
            return
        waiting = [
            (job, record)
            for job in sorted(self.pending.jobs.values(), key=lambda j: (j.submit_seq, j.id))
            if (record := known.get(job.id)) is not None
        ]
        changes = Changes()
        started: list[tuple[JobRecord, tuple[WorkerPlacement, ...]]] = []
        for job_id, workers in sorted(resizer.sizes(now, self.base, running, waiting).items()):
            record = known[job_id]
            current, step = len(record.workers), record.job.request.gpus
            common: dict[str, object] = {
                "resizes": record.resizes + 1,
                "resized_at": now,
                "resizing": True,
                "attained_gpu_seconds": attained_until(record, now),
            }
            if workers < current:
                target = kept_on_densest(record.workers, workers)
                why = f"shrinking from {current * step} to {workers * step} GPU(s) to admit waiting jobs"
                new = changes.resize(record, why, now, resize_to=target, **common)
            else:
                grown = resizer.grow(now, self.base, record, workers)
                if grown is None:
                    continue
                target = grown.target
                why = f"growing from {current * step} to {workers * step} GPU(s) into idle GPUs"
                regathered = {"resize_to": target} if grown.held != target else {}
                new = changes.resize(record, why, now, workers=grown.held, **common, **regathered)
                self.base.remove_running(job_id)
                self.base.add_running(new.as_running())
            started.append((new, target))
        self._write(changes)
        for record, target in started:
            launch = dataclasses.replace(self._launch(record), workers=target)
            self.backend.resize(launch, self._grace(record), record.resizes)
            report.resized += 1

    def _cohort_mates(self, queues: set[str]) -> set[str]:
        specs = self.base.queues
        cohorts = {specs[q].cohort for q in queues if q in specs and specs[q].cohort is not None}
        return queues | {name for name, spec in specs.items() if spec.cohort in cohorts}

    # --- apply ------------------------------------------------------------------------------------

    def _apply(self, now: float, result: CycleResult, report: StepReport) -> None:
        changes = Changes()
        launches: list[Launch] = []
        stops: list[tuple[JobRecord, str]] = []
        for placement in result.placements:
            record = self._latest(placement.job, changes)
            if record is None or record.state is not S.PENDING:
                continue
            admitted = changes.move(record, S.ADMITTED, "placed by the scheduler", now, workers=placement.workers)
            plan = None
            if record.checkpoint_cost_s is not None:  # only a job that reported a checkpoint has a C
                pools = self.observed_pools()
                plan = plan_checkpoints(record.checkpoint_cost_s, placement.workers, self._nodes, pools)
            launching = changes.move(
                admitted,
                S.LAUNCHING,
                "launch requested",
                now,
                attempt=record.attempt + 1,
                started_at=now,
                first_started_at=record.first_started_at if record.first_started_at is not None else now,
                waiting_code="",
                waiting_reason="",
                checkpoint_plan=plan,
            )
            self.pending.remove(record.id)
            self.nominated.discard(record.id)
            self._reason_at.pop(record.id, None)
            run = launching.as_running()
            if self.resizer is not None and run.job.resizable:
                self.resizer.active = True
            self.base.add_running(run)
            self.learning.started(run)
            self._track_deadline(launching)
            launches.append(self._launch(launching))
            report.placed += 1
        for preemption in result.preemptions:
            record = self._latest(preemption.victim, changes)
            if record is None or record.state not in (S.RUNNING, S.LAUNCHING):
                continue
            evicting = changes.move(
                record,
                S.EVICTING,
                f"preempted for {preemption.for_job}: {preemption.reason}",
                now,
                evicting_for=preemption.for_job,
                stop_cause=StopCause.PREEMPTED,
            )
            self.base.set_evicting(record.id, preemption.for_job)
            self.nominated.add(preemption.for_job)
            stops.append((evicting, preemption.reason))
            report.preempted += 1
        for migration in result.migrations:
            record = self._latest(migration.job, changes)
            if record is None or record.state not in (S.RUNNING, S.LAUNCHING):
                continue
            reason = f"moved: {migration.reason}"
            stops.append((self._stop(record, StopCause.PREEMPTED, reason, now, changes), reason))
            report.migrated += 1
        refresh = self.settings.reason_refresh_s
        for job_id, status in result.waiting.items():
            record = self._latest(job_id, changes)
            if record is None or record.state is not S.PENDING:
                continue
            code = status.code.value
            if record.waiting_code == code and now < self._reason_at.get(job_id, -math.inf) + refresh:
                continue
            reason = status.message()
            if record.waiting_code != code or record.waiting_reason != reason:
                changes.add(record.evolve(waiting_code=code, waiting_reason=reason))
                self._reason_at[job_id] = now
        self._write(changes)
        for launch in launches:
            self.backend.launch(launch)
        for record, reason in stops:
            self.backend.stop(record.id, record.attempt, self._grace(record), reason)

    def _launch(self, record: JobRecord) -> Launch:
        queue = self.base.queues.get(record.job.queue)
        plan = record.checkpoint_plan
        return Launch(
            record.job,
            record.attempt,
            record.workers,
            run_as=queue.run_as if queue else None,
            memory_per_gpu=queue.memory_per_gpu if queue else None,
            memory_no_gpu=queue.memory_no_gpu if queue else None,
            disk=queue.disk if queue else None,
            checkpoint_interval_s=plan.interval_s if plan is not None else None,
        )

    def _latest(self, job_id: JobId, changes: Changes) -> JobRecord | None:
        record = changes.latest.get(job_id)
        if record is not None:
            return record
        # The loop is the only writer of job records once submitted: what it last wrote is current.
        record = self._known.get(job_id)
        return record if record is not None else self.store.get(job_id)

    def _write(self, changes: Changes) -> None:
        if not changes.records:
            return
        self.store.write(collapse(changes.records), changes.transitions)
        gate = self.gate
        for record in changes.latest.values():
            if record.state.terminal:
                self._known.pop(record.id, None)
                self.learning.forget(record.id)
            else:
                self._known[record.id] = record
            gate.changed(record)
        if self.events is not None:
            for t in changes.transitions:
                self.events.emit(t)
