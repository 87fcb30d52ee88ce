"""Pending jobs in the profile's order, grouped, and which of them must be decided this step.

Jobs are grouped: with strict FIFO by queue (only the head can go), otherwise by queue and request
(identical requests in one queue fare identically within a cycle, as the core's failure cache
relies on too). A group whose first jobs failed is parked with the event that could let it in (the
core's `Wake` hint) and woken by that event only, as Kubernetes' queueing hints do: a step costs
what changed, not what waits. A job the core calls unresolvable leaves the order until the cluster
changes, so it never blocks a queue.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping

from gpufleet.domain.jobs import Job, JobId
from gpufleet.scheduling.classes import RequestClass
from gpufleet.scheduling.plugin_api import Code, SortKey, Status, Wake

Group = tuple[object, ...]  # a queue (strict FIFO) or a `RequestClass`
Entry = tuple[SortKey, JobId]


class PendingIndex:
    def __init__(self, strict_fifo: bool, burst: int = 8) -> None:
        self.strict_fifo = strict_fifo
        self.burst = burst
        self.jobs: dict[JobId, Job] = {}
        self._entries: dict[JobId, Entry] = {}
        self.groups: dict[Group, list[Entry]] = defaultdict(list)
        self.parked: dict[Group, Wake] = {}
        self.active: set[Group] = set()
        self.unresolvable: set[JobId] = set()

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.jobs

    def group_of(self, job: Job) -> Group:
        if self.strict_fifo:
            return (job.queue,)
        return RequestClass.of(job)

    def add(self, job: Job, key: SortKey) -> None:
        """A job becomes pending (submitted, or back after preemption): its group is decided next step."""
        if job.id in self.jobs:
            self.remove(job.id)
        entry: Entry = ((*key, job.submit_seq, job.id), job.id)
        self.jobs[job.id] = job
        self._entries[job.id] = entry
        group = self.group_of(job)
        bisect.insort(self.groups[group], entry)
        self.parked.pop(group, None)
        self.active.add(group)

    def remove(self, job_id: JobId) -> None:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        entry = self._entries.pop(job_id)
        if job_id in self.unresolvable:
            self.unresolvable.discard(job_id)
            return
        group = self.group_of(job)
        entries = self.groups[group]
        del entries[bisect.bisect_left(entries, entry)]
        if not entries:
            del self.groups[group]
            self.parked.pop(group, None)
            self.active.discard(group)

    def wake(self, wake: Wake, queues: Iterable[str] | None = None) -> None:
        """Activate the parked groups waiting for `wake` (only those of `queues`, if given)."""
        allowed = None if queues is None else set(queues)
        woken = [g for g, w in self.parked.items() if w is wake and (allowed is None or g[0] in allowed)]
        for group in woken:
            del self.parked[group]
            self.active.add(group)

    def wake_all(self) -> None:
        self.active.update(self.parked)
        self.parked.clear()
        for job_id in sorted(self.unresolvable):
            job = self.jobs[job_id]
            self.unresolvable.discard(job_id)
            group = self.group_of(job)
            bisect.insort(self.groups[group], self._entries[job_id])
            self.active.add(group)

    def to_decide(self, first_claims: Iterable[JobId]) -> list[Job]:
        """Up to `burst` first jobs of every active group, plus jobs with a first claim."""
        chosen: set[JobId] = {j for j in first_claims if j in self.jobs and j not in self.unresolvable}
        for group in self.active:
            chosen.update(job_id for _, job_id in self.groups.get(group, ())[: self.burst])
        return [self.jobs[j] for j in sorted(chosen, key=lambda j: self._entries[j])]

    def settle(self, decided: Iterable[Job], waiting: Mapping[JobId, Status]) -> bool:
        """After a cycle: park each decided group with the wake of its first waiting job, or keep it
        active if all it sent were placed and it has more. True if another cycle is worth running."""
        again = False
        by_group: dict[Group, list[Job]] = defaultdict(list)
        for job in decided:
            by_group[self.group_of(job)].append(job)
        for group in sorted(by_group, key=repr):
            self.active.discard(group)
            for job in by_group[group]:
                status = waiting.get(job.id)
                if status is not None and status.code is Code.UNRESOLVABLE and job.id in self.jobs:
                    self._set_aside(job)
            first_wait = next((waiting[j.id] for j in by_group[group] if j.id in waiting and j.id in self.jobs), None)
            if group not in self.groups:
                continue
            if first_wait is None or first_wait.code is Code.UNRESOLVABLE:
                self.active.add(group)  # everything sent went in (or aside): send the next ones
                again = True
            else:
                self.parked[group] = first_wait.wake
        return again

    def _set_aside(self, job: Job) -> None:
        group = self.group_of(job)
        entries = self.groups[group]
        del entries[bisect.bisect_left(entries, self._entries[job.id])]
        if not entries:
            del self.groups[group]
            self.parked.pop(group, None)
            self.active.discard(group)
        self.unresolvable.add(job.id)
