"""The gate between the store's pending jobs and the scheduler: a job whose dependencies are not met, an array
task over its array's throttle, or a singleton whose name is in use waits here, out of the scheduler's sight.

So the scheduler never reserves GPUs for such a job, nor counts it in quotas, fair share or a queue's order,
and its decisions for jobs without any of these are the same as if the gate were not there. The gate keeps, per
waiting job, the parents it still waits on; a parent's change re-judges only its own children, so a step costs
what changed, not what waits. A job enters the gate once (on submit, or when the loop rebuilds its state): one
that is back in its queue after a preemption or a retry passed it already and keeps its throttle slot.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpufleet.domain.dependencies import DepKind, Verdict, judge
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.records import JobRecord

NEVER_CODE = "DependencyNeverSatisfied"

Lookup = Callable[[JobId], JobRecord | None]


def _started(record: JobRecord) -> bool:
    return record.first_started_at is not None or record.holds_resources


@dataclass
class _Waiting:
    job: Job
    unmet: dict[JobId, list[DepKind]] = field(default_factory=dict)


@dataclass
class _Throttle:
    limit: int
    released: set[JobId] = field(default_factory=set)
    queue: list[tuple[int, JobId]] = field(default_factory=list)  # (task index, id), a heap


class DependencyGate:
    def __init__(self, lookup: Lookup, busy: Callable[[str, str, JobId], bool]) -> None:
        """`lookup`: a job's current record; `busy(user, name, job_id)`: whether another job of that name and
        submitter holds resources now."""
        self.lookup = lookup
        self.busy = busy
        self.waiting: dict[JobId, _Waiting] = {}
        self.children: dict[JobId, set[JobId]] = defaultdict(set)
        self.throttles: dict[JobId, _Throttle] = {}
        self.throttled: dict[JobId, Job] = {}
        self.singletons: dict[tuple[str, str], list[tuple[int, JobId]]] = defaultdict(list)
        self.singleton_jobs: dict[JobId, Job] = {}
        self.singleton_holder: dict[tuple[str, str], JobId] = {}
        self._changed: dict[JobId, JobRecord | None] = {}  # None: look it up
        self._ready: list[Job] = []
        self._never: list[tuple[Job, str]] = []

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.waiting or job_id in self.throttled or job_id in self.singleton_jobs

    def __len__(self) -> int:
        return len(self.waiting) + len(self.throttled) + len(self.singleton_jobs)

    def holding(self, records: Iterable[JobRecord]) -> None:
        """Jobs that hold resources (when the loop rebuilds its state): each takes its array's throttle slot and
        its singleton name."""
        for record in records:
            job = record.job
            if job.array is not None and job.array.throttle is not None:
                self._throttle(job).released.add(job.id)
            if any(d.kind is DepKind.SINGLETON for d in job.depends_on):
                self.singleton_holder.setdefault((job.user, job.name), job.id)

    def admit(self, job: Job) -> bool:
        """A pending job the scheduler has not seen: True if it may go to the scheduler now, else it waits here
        (what is then ready or never can be comes out of `settle`)."""
        entry = _Waiting(job)
        for dep in job.depends_on:
            if dep.kind is DepKind.SINGLETON:
                continue
            parent = self.lookup(dep.job_id)
            if parent is None:
                self._never.append((job, f"{NEVER_CODE}: {dep} names a job that no longer exists"))
                return False
            verdict = judge(dep.kind, parent.state, _started(parent))
            if verdict is Verdict.NEVER:
                self._never.append((job, f"{NEVER_CODE}: {dep} ended {parent.state.value}"))
                return False
            if verdict is Verdict.WAIT:
                entry.unmet.setdefault(dep.job_id, []).append(dep.kind)
        if entry.unmet:
            self.waiting[job.id] = entry
            for parent_id in entry.unmet:
                self.children[parent_id].add(job.id)
            return False
        return self._past_dependencies(job, now=True)

    def remove(self, job_id: JobId) -> None:
        """The job left before it was released (cancelled): it waits on nothing any more."""
        entry = self.waiting.pop(job_id, None)
        if entry is not None:
            for parent_id in entry.unmet:
                kids = self.children.get(parent_id)
                if kids is not None:
                    kids.discard(job_id)
                    if not kids:
                        del self.children[parent_id]
        # Its entry in its array's or name's queue is dropped when it comes up (a whole array cancelled at once
        # would otherwise rebuild the queue once per task).
        self.throttled.pop(job_id, None)
        self.singleton_jobs.pop(job_id, None)
        self._changed.setdefault(job_id, None)

    def changed(self, record: JobRecord) -> None:
        """A job's record was written: its children, its array's throttle or its name's singletons may move."""
        job = record.job
        if (
            record.id in self.children
            or (job.array is not None and job.array.array_id in self.throttles)
            or (job.user, job.name) in self.singletons
            or (job.user, job.name) in self.singleton_holder
        ):
            self._changed[record.id] = record

    def settle(self) -> tuple[list[Job], list[tuple[Job, str]]]:
        """The jobs that may go to the scheduler now, and those whose dependencies can never be met (with why)."""
        while self._changed:
            changed, self._changed = self._changed, {}
            for job_id in sorted(changed):
                record = changed[job_id] or self.lookup(job_id)
                self._parent_moved(job_id, record)
                if record is None or record.state.terminal or not record.holds_resources:
                    self._slot_freed(job_id, record)
        ready, never = self._ready, self._never
        self._ready, self._never = [], []
        return ready, never

    # --- stages ------------------------------------------------------------------------------------------

    def _parent_moved(self, parent_id: JobId, record: JobRecord | None) -> None:
        for child_id in sorted(self.children.get(parent_id, ())):
            entry = self.waiting[child_id]
            kinds = entry.unmet[parent_id]
            for kind in kinds:
                verdict = Verdict.NEVER if record is None else judge(kind, record.state, _started(record))
                if verdict is Verdict.NEVER:
                    what = "no longer exists" if record is None else f"ended {record.state.value}"
                    self.remove(child_id)
                    self._never.append((entry.job, f"{NEVER_CODE}: {kind.value}:{parent_id} {what}"))
                    break
                if verdict is Verdict.WAIT:
                    break
            else:
                del entry.unmet[parent_id]
                self.children[parent_id].discard(child_id)
                if not entry.unmet:
                    del self.waiting[child_id]
                    self._past_dependencies(entry.job, now=False)
        if parent_id in self.children and not self.children[parent_id]:
            del self.children[parent_id]

    def _throttle(self, job: Job) -> _Throttle:
        assert job.array is not None
        assert job.array.throttle is not None
        throttle = self.throttles.get(job.array.array_id)
        if throttle is None:
            throttle = self.throttles[job.array.array_id] = _Throttle(job.array.throttle)
        return throttle

    def _past_dependencies(self, job: Job, *, now: bool) -> bool:
        """Its dependencies are met: next its array's throttle, then its singleton name."""
        if job.array is not None and job.array.throttle is not None:
            throttle = self._throttle(job)
            if job.id not in throttle.released and len(throttle.released) >= throttle.limit:
                self.throttled[job.id] = job
                heapq.heappush(throttle.queue, (job.array.task, job.id))
                return False
            throttle.released.add(job.id)
        return self._past_throttle(job, now=now)

    def _past_throttle(self, job: Job, *, now: bool) -> bool:
        if any(d.kind is DepKind.SINGLETON for d in job.depends_on):
            key = (job.user, job.name)
            holder = self.singleton_holder.get(key)
            if (holder is not None and holder != job.id) or self.busy(job.user, job.name, job.id):
                self.singleton_jobs[job.id] = job
                heapq.heappush(self.singletons[key], (job.submit_seq, job.id))
                return False
            self.singleton_holder[key] = job.id
        if not now:
            self._ready.append(job)
        return True

    def _slot_freed(self, job_id: JobId, record: JobRecord | None) -> None:
        """A job that held resources no longer does (or is gone): the next task of its array, or the next
        singleton of its name, may go."""
        if record is None:
            return
        job = record.job
        array = job.array
        gone = record.state.terminal or record.state is JobState.HELD  # a held job gives its slot back
        if array is not None and array.array_id in self.throttles and gone:
            throttle = self.throttles[array.array_id]
            throttle.released.discard(job_id)
            while throttle.queue and len(throttle.released) < throttle.limit:
                _, next_id = heapq.heappop(throttle.queue)
                next_job = self.throttled.pop(next_id, None)
                if next_job is None:
                    continue  # it left while it waited
                throttle.released.add(next_id)
                self._past_throttle(next_job, now=False)
            if not throttle.queue and not throttle.released:
                del self.throttles[array.array_id]
        key = (job.user, job.name)
        if self.singleton_holder.get(key) == job_id and gone:
            del self.singleton_holder[key]
        waiting = self.singletons.get(key)
        while waiting and key not in self.singleton_holder:
            _, next_id = waiting[0]
            if next_id not in self.singleton_jobs:
                heapq.heappop(waiting)  # it left while it waited
                continue
            if self.busy(key[0], key[1], next_id):
                break
            heapq.heappop(waiting)
            next_job = self.singleton_jobs.pop(next_id)
            self.singleton_holder[key] = next_id
            self._ready.append(next_job)
        if waiting is not None and not waiting:
            del self.singletons[key]
