"""`run_cycle`: the pure, deterministic heart of gpufleet.

    snapshot + pending jobs + profile  ->  placements, preemptions, and why every other job waits

No I/O, no clock, no randomness: the same input gives a byte-identical result (`CycleResult.to_json`).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.snapshot import ClusterSnapshot, Placement, Preemption
from gpufleet.scheduling.placer import evaluate, place_gang, place_worker
from gpufleet.scheduling.plugins import GangContext, JobView, Profile, SortKey
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.status import Code, Status, unresolvable, wait

PLUGIN = "cycle"


@dataclass(frozen=True, slots=True)
class CycleResult:
    placements: tuple[Placement, ...]
    preemptions: tuple[Preemption, ...]
    waiting: Mapping[JobId, Status]

    def to_json(self) -> str:
        """Canonical serialisation: equal results give equal strings."""
        return json.dumps(
            {
                "placements": [
                    {
                        "job": p.job,
                        "workers": [
                            {
                                "node": w.node,
                                "gpus": [[s.index, s.milli, s.memory] for s in w.gpus],
                                "cpu_milli": w.cpu_milli,
                                "memory": w.memory,
                            }
                            for w in p.workers
                        ],
                    }
                    for p in self.placements
                ],
                "preemptions": [dataclasses.asdict(p) for p in self.preemptions],
                "waiting": {
                    j: {"code": s.code.value, "reasons": list(s.reasons), "plugin": s.plugin}
                    for j, s in sorted(self.waiting.items())
                },
            },
            sort_keys=True,
            separators=(",", ":"),
        )


class _Trial:
    """Admission + placement on the current (what-if) view, undone afterwards."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def admits(self, job: Job, state: CycleState) -> Status:
        return _admit(self.profile, job, state)[1]

    def fits(self, job: Job, state: CycleState) -> bool:
        view, status = _admit(self.profile, job, state)
        if not status.ok:
            return False
        outcome = place_gang(self.profile, view, state, job.gang_size)
        if isinstance(outcome, Status):
            return False
        for worker in outcome:
            state.table.apply(worker, +1)
        return True

    def worker_fits(self, job: Job, state: CycleState, node: int) -> bool:
        view = JobView(job, state.table.model_lut(job.request.models))
        _, passed, _ = evaluate(self.profile, view, state)
        return bool(passed[node])


def _admit(profile: Profile, job: Job, state: CycleState) -> tuple[JobView, Status]:
    view = JobView(job, state.table.model_lut(job.request.models))
    for plugin in profile.admit:
        status = plugin.admit(view, state)
        if not status.ok:
            return view, status
    return view, Status(Code.SUCCESS)


def _class_key(view: JobView) -> tuple[object, ...]:
    job = view.job
    return (job.request, job.gang_size, view.model_lut.tobytes())


class _Cycle:
    def __init__(self, snapshot: ClusterSnapshot, profile: Profile) -> None:
        self.profile = profile
        self.state = CycleState(snapshot)
        self.trial = _Trial(profile)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[JobId, Status] = {}
        self.unfit: dict[tuple[object, ...], Status] = {}
        self.no_victims: dict[tuple[object, ...], Status] = {}

    def decide(self, job: Job) -> bool:
        """Place the job, preempt for it, or record why it waits. True if placed."""
        state = self.state
        view, status = _admit(self.profile, job, state)
        if status.ok:
            key = _class_key(view)
            cached = self.unfit.get(key)
            if cached is not None:
                status = cached
            else:
                outcome = place_gang(self.profile, view, state, job.gang_size)
                if not isinstance(outcome, Status):
                    self._commit(job, outcome)
                    return True
                status = outcome
                self.unfit[key] = outcome
        outstanding = [v for v in state.evicting_for.get(job.id, ()) if v in state.holdings]
        if outstanding and status.code in (Code.UNSCHEDULABLE, Code.WAIT):
            self.waiting[job.id] = wait(
                PLUGIN,
                f"waiting for {len(outstanding)} preempted job(s) to stop: {', '.join(sorted(outstanding))}",
                status.message(),
            )
            return False
        if status.code is Code.UNSCHEDULABLE and self.profile.preempt is not None:
            status = self._preempt(view, status)
        self.waiting[job.id] = status
        return False

    def _preempt(self, view: JobView, blocked_by: Status) -> Status:
        assert self.profile.preempt is not None
        job = view.job
        key = (*_class_key(view), job.queue, job.priority)
        cached = self.no_victims.get(key)
        if cached is not None:
            return cached
        choice = self.profile.preempt.preempt(view, self.state, blocked_by, self.trial)
        if not choice.victims:
            self.no_victims[key] = choice.status
            return choice.status
        for victim, reason in choice.victims:
            self.state.evicting.add(victim)
            self.state.evicting_for[job.id].append(victim)
            self.preemptions.append(Preemption(victim, job.id, reason))
        return choice.status

    def _commit(self, job: Job, gang: tuple[WorkerPlacement, ...]) -> None:
        state = self.state
        state.allocate(job, gang)
        if self.profile.elastic_grow and job.workers > job.gang_size:
            self._grow(job)
        self.placements.append(Placement(job.id, state.holdings[job.id].workers))

    def _grow(self, job: Job) -> None:
        """Add workers to an elastic job beyond its minimum while they fit, quota included."""
        state = self.state
        single = dataclasses.replace(job, workers=1, min_workers=None)
        context = GangContext([state.table.index[w.node] for w in state.holdings[job.id].workers])
        for _ in range(job.workers - job.gang_size):
            view, status = _admit(self.profile, single, state)
            if not status.ok:
                return
            outcome = place_worker(self.profile, view, state, context)
            if isinstance(outcome, Status):
                return
            state.extend(job.id, outcome)


def run_cycle(snapshot: ClusterSnapshot, pending: Sequence[Job], profile: Profile) -> CycleResult:
    """Decide one scheduling cycle. Pure: reads its inputs only, returns decisions as data."""
    cycle = _Cycle(snapshot, profile)
    state = cycle.state
    known_queues = {q.name for q in snapshot.queues}
    by_queue: dict[str, list[Job]] = defaultdict(list)
    seen: set[JobId] = set()
    for job in pending:
        if job.id in seen or job.id in state.holdings:
            cycle.waiting[job.id] = Status(
                Code.ERROR, (f"job {job.id} is pending twice, or pending and running at once",), PLUGIN
            )
            continue
        seen.add(job.id)
        if known_queues and job.queue not in known_queues:
            cycle.waiting[job.id] = unresolvable(
                PLUGIN,
                f"queue {job.queue} does not exist (queues: {', '.join(sorted(known_queues))})",
            )
            continue
        by_queue[job.queue].append(job)

    order = profile.order
    queues: dict[str, list[Job]] = {}
    for name, jobs in by_queue.items():
        jobs.sort(key=lambda j: (*order.job_key(j, state), j.submit_seq, j.id), reverse=True)
        queues[name] = jobs  # a stack: the next job is last

    def rank(name: str) -> tuple[SortKey, str]:
        head = queues[name][-1]
        return (*order.queue_key(name, head, state), head.submit_seq, head.id), name

    heap = [rank(name) for name in sorted(queues)]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        jobs = queues[name]
        job = jobs.pop()
        placed = cycle.decide(job)
        if not placed and profile.strict_fifo and cycle.waiting[job.id].code is not Code.UNRESOLVABLE:
            for behind in jobs:
                cycle.waiting[behind.id] = wait(PLUGIN, f"behind job {job.id} in queue {name} (strict FIFO)")
            jobs.clear()
        if jobs:
            heapq.heappush(heap, rank(name))

    return CycleResult(tuple(cycle.placements), tuple(cycle.preemptions), dict(sorted(cycle.waiting.items())))
