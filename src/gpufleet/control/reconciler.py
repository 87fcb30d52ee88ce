"""`Reconciler.step()`: observe -> snapshot -> decide -> apply. The one control loop of gpufleet.

The same class runs live (wall clock, a real backend, a database) and in the simulator (simulated
clock and backend, in-memory store): only the ports passed in differ.

- Observe: what the backend reports (started, exited, stopped, lost) becomes transitions.
- Snapshot: a base working state is kept in step with the store and forked for each cycle.
- Decide: the pure core (`decide`) on the jobs that need a decision now (see `PendingIndex`).
- Apply: first the intents are written (placements as Launching, victims as Evicting) in one
  short write with version checks, then, outside it, the backend is asked to launch and stop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.control.pending import PendingIndex
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState, Transition, transition
from gpufleet.domain.records import JobRecord
from gpufleet.domain.snapshot import ClusterSnapshot
from gpufleet.ports import Clock, EventSink, ExecutionBackend, Launch, Observation, ObservationKind, StateStore
from gpufleet.scheduling.cycle import CycleResult, decide
from gpufleet.scheduling.plugins import Profile
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.status import Wake

S = JobState


@dataclass(frozen=True)
class ReconcilerSettings:
    grace_s: float = 30.0  # checkpoint grace period given to preemption victims
    retry_all_s: float = 300.0  # with preemption: retry every parked job this often (as Kubernetes does)
    max_cycles_per_step: int = 64


@dataclass
class StepReport:
    placed: int = 0
    preempted: int = 0
    finished: int = 0
    cycles: int = 0
    decided: int = 0
    core_seconds: float = 0.0


@dataclass
class _Changes:
    records: list[JobRecord] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)

    def move(self, record: JobRecord, target: JobState, reason: str, at: float, **changes: object) -> JobRecord:
        self.transitions.append(transition(record.id, record.state, target, reason, at))
        new = record.evolve(state=target, **changes)
        self.records.append(new)
        return new


def _gpus(record: JobRecord) -> float:
    return sum(s.milli for w in record.workers for s in w.gpus) / 1000.0


class Reconciler:
    def __init__(
        self,
        store: StateStore,
        backend: ExecutionBackend,
        clock: Clock,
        profile: Profile,
        events: EventSink | None = None,
        settings: ReconcilerSettings | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.clock = clock
        self.profile = profile
        self.events = events
        self.settings = settings or ReconcilerSettings()
        self.pending = PendingIndex(profile.strict_fifo)
        self.nominated: set[JobId] = set()
        self._cursor = 0
        self._cluster_version = -1
        self._last_retry_all = clock.now()
        self.base = self._rebuild()

    # --- the loop -------------------------------------------------------------------------------

    def step(self) -> StepReport:
        report = StepReport()
        now = self.clock.now()
        if self.store.cluster_version() != self._cluster_version:
            self.base = self._rebuild()
            self.pending.wake_all()
        self._observe(now, report)
        self._intake()
        if self.profile.preempt is not None and now >= self._last_retry_all + self.settings.retry_all_s:
            self.pending.wake_all()
            self._last_retry_all = now
        for _ in range(self.settings.max_cycles_per_step):
            jobs = self.pending.to_decide(self.nominated)
            if not jobs:
                break
            started = time.perf_counter()
            result = decide(self.base.fork(now), jobs, self.profile, sorted(self.nominated))
            report.core_seconds += time.perf_counter() - started
            report.cycles += 1
            report.decided += len(jobs)
            self._apply(now, result, report)
            if not self.pending.settle(jobs, result.waiting):
                break
        return report

    def next_retry_at(self) -> float | None:
        """When parked jobs will be retried regardless of events (None: only events wake them)."""
        if self.profile.preempt is None or not self.pending.parked:
            return None
        return self._last_retry_all + self.settings.retry_all_s

    # --- snapshot ---------------------------------------------------------------------------------

    def _rebuild(self) -> CycleState:
        """The base state from the store (at start, and when nodes or queues change)."""
        self._cluster_version = self.store.cluster_version()
        records = self.store.active()
        running = tuple(r.as_running() for r in records if r.holds_resources)
        snapshot = ClusterSnapshot(self.store.nodes(), running, self.store.queues(), now=self.clock.now())
        base = CycleState(snapshot)
        for record in records:
            if record.state is S.PENDING and record.id not in self.pending:
                self.pending.add(record.as_pending(), self._key(record.as_pending(), base))
        self._cursor = max(self._cursor, 0)
        return base

    def _key(self, job: Job, base: CycleState) -> tuple[float | int | str, ...]:
        return self.profile.order.job_key(job, base)

    def _intake(self) -> None:
        submitted, self._cursor = self.store.take_submissions(self._cursor)
        for record in submitted:
            if record.state is S.PENDING and record.id not in self.pending:
                job = record.as_pending()
                self.pending.add(job, self._key(job, self.base))

    # --- observe ----------------------------------------------------------------------------------

    def _observe(self, now: float, report: StepReport) -> None:
        observations = self.backend.poll()
        if not observations:
            return
        changes = _Changes()
        released_queues: set[str] = set()
        requeued: list[JobRecord] = []
        for obs in observations:
            record = self._current(obs, changes)
            if record is None:
                continue
            outcome = self._observed(record, obs, changes)
            if outcome is None:
                continue
            if not outcome.holds_resources and record.holds_resources:
                self.base.remove_running(record.id)
                released_queues.add(record.job.queue)
                self.nominated.discard(record.id)
                if outcome.state is S.PENDING:
                    requeued.append(outcome)
                else:
                    report.finished += 1
        self._write(changes)
        for record in requeued:
            job = record.as_pending()
            self.pending.add(job, self._key(job, self.base))
        if released_queues:
            self.pending.wake(Wake.RELEASE)
            self.pending.wake(Wake.QUOTA, self._cohort_mates(released_queues))

    def _current(self, obs: Observation, changes: _Changes) -> JobRecord | None:
        record = self._latest(obs.job_id, changes)
        if record is None or record.attempt != obs.attempt or record.state.terminal:
            return None  # stale: an earlier attempt, or already finished
        return record

    def _observed(self, record: JobRecord, obs: Observation, changes: _Changes) -> JobRecord | None:
        at = obs.at
        checkpoint = obs.checkpoint_at if obs.checkpoint_at is not None else record.last_checkpoint_at
        if obs.kind is ObservationKind.STARTED:
            if record.state is S.LAUNCHING:
                return changes.move(record, S.RUNNING, "all workers started", at, started_at=at)
            return None
        attained = record.attained_gpu_seconds
        if record.started_at is not None and record.state in (S.RUNNING, S.EVICTING, S.LAUNCHING):
            attained += _gpus(record) * max(0.0, at - record.started_at)
        if obs.kind is ObservationKind.EXITED:
            if record.state not in (S.RUNNING, S.EVICTING, S.LAUNCHING):
                return None
            if record.state is S.LAUNCHING:
                record = changes.move(record, S.RUNNING, "all workers started", at, started_at=record.started_at)
            code = obs.exit_code if obs.exit_code is not None else 0
            target = S.SUCCEEDED if code == 0 else S.FAILED
            reason = (
                "all workers exited 0"
                if code == 0
                else f"a worker exited {code}" + (f": {obs.detail}" if obs.detail else "")
            )
            return changes.move(
                record,
                target,
                reason,
                at,
                finished_at=at,
                exit_code=code,
                attained_gpu_seconds=attained,
                last_checkpoint_at=checkpoint,
                evicting_for=None,
            )
        if obs.kind is ObservationKind.STOPPED:
            if record.state is not S.EVICTING:
                return None
            return changes.move(
                record,
                S.PENDING,
                f"preempted for {record.evicting_for}; back in queue {record.job.queue}",
                at,
                workers=(),
                started_at=None,
                attained_gpu_seconds=attained,
                last_checkpoint_at=checkpoint,
                evicting_for=None,
                preemptions=record.preemptions + 1,
            )
        if obs.kind is ObservationKind.LOST and record.state in (S.RUNNING, S.LAUNCHING, S.EVICTING):
            if record.state is S.EVICTING:
                return changes.move(
                    record,
                    S.PENDING,
                    f"lost while being preempted: {obs.detail}",
                    at,
                    workers=(),
                    started_at=None,
                    attained_gpu_seconds=attained,
                    evicting_for=None,
                    preemptions=record.preemptions + 1,
                )
            return changes.move(
                record,
                S.PENDING,
                f"lost ({obs.detail or 'no reason given'}); retried",
                at,
                workers=(),
                started_at=None,
                attained_gpu_seconds=attained,
                last_checkpoint_at=checkpoint,
            )
        return None

    def _cohort_mates(self, queues: set[str]) -> set[str]:
        specs = self.base.ledger.queues
        cohorts = {specs[q].cohort for q in queues if q in specs and specs[q].cohort is not None}
        return queues | {name for name, spec in specs.items() if spec.cohort in cohorts}

    # --- apply ------------------------------------------------------------------------------------

    def _apply(self, now: float, result: CycleResult, report: StepReport) -> None:
        changes = _Changes()
        launches: list[Launch] = []
        stops: list[tuple[JobRecord, str]] = []
        for placement in result.placements:
            record = self.store.get(placement.job)
            if record is None or record.state is not S.PENDING:
                continue
            admitted = changes.move(record, S.ADMITTED, "placed by the scheduler", now, workers=placement.workers)
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
            )
            self.pending.remove(record.id)
            self.nominated.discard(record.id)
            self.base.add_running(launching.as_running())
            launches.append(Launch(launching.job, launching.attempt, launching.workers))
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
            )
            self.base.set_evicting(record.id, preemption.for_job)
            self.nominated.add(preemption.for_job)
            stops.append((evicting, preemption.reason))
            report.preempted += 1
        for job_id, status in result.waiting.items():
            record = self._latest(job_id, changes)
            if record is None or record.state is not S.PENDING:
                continue
            reason = status.message()
            if record.waiting_code != status.code.value or record.waiting_reason != reason:
                changes.records.append(record.evolve(waiting_code=status.code.value, waiting_reason=reason))
        self._write(changes)
        for launch in launches:
            self.backend.launch(launch)
        for record, reason in stops:
            self.backend.stop(record.id, record.attempt, self.settings.grace_s, reason)

    def _latest(self, job_id: JobId, changes: _Changes) -> JobRecord | None:
        for record in reversed(changes.records):
            if record.id == job_id:
                return record
        return self.store.get(job_id)

    def _write(self, changes: _Changes) -> None:
        if not changes.records:
            return
        self.store.write(_collapse(changes.records), changes.transitions)
        if self.events is not None:
            for t in changes.transitions:
                self.events.emit(t)


def _collapse(records: Sequence[JobRecord]) -> list[tuple[int, JobRecord]]:
    """Several versions of one record written at once: the last one, with the version it started from."""
    first: dict[JobId, int] = {}
    latest: dict[JobId, JobRecord] = {}
    for record in records:
        first.setdefault(record.id, record.version - 1)
        latest[record.id] = record
    return [(first[job_id], record) for job_id, record in latest.items()]
