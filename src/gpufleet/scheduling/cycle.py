"""`run_cycle`: the pure, deterministic heart of gpufleet.

    snapshot + pending jobs + profile  ->  placements, preemptions, and why every other job waits

No I/O, no clock, no randomness: the same input gives a byte-identical result (`CycleResult.to_json`).
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import json
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.snapshot import ClusterSnapshot, Placement, Preemption
from gpufleet.scheduling.ledger import job_usage
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
        if job.gang_size == 1:
            # One worker is placed exactly when some node passes the filters: no need to place it.
            return bool(evaluate(self.profile, view, state).passed.any())
        outcome = place_gang(self.profile, view, state, job.gang_size)
        if isinstance(outcome, Status):
            return False
        state.table.apply_many(outcome, +1)
        return True

    def worker_fits(self, job: Job, state: CycleState, node: int) -> bool:
        # The class's cached filter results, refreshed where nodes changed, are the filters run on `node`.
        view = JobView(job, state.table.model_lut(job.request.models))
        return bool(evaluate(self.profile, view, state).passed[node])


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


def _request_key(job: Job) -> tuple[object, ...]:
    """Queue, request and gang size of a job, as a key of per-cycle caches. The request's fields rather
    than the request: equal tuples of ints compare in C, while equal-but-distinct requests would run
    the dataclass's Python `__eq__` on every look-up."""
    r = job.request
    return (
        job.queue,
        r.gpus,
        r.gpu_milli,
        r.gpu_memory,
        r.cpu_milli,
        r.memory,
        r.models,
        job.min_workers or job.workers,
    )


class _Cycle:
    def __init__(self, state: CycleState, profile: Profile) -> None:
        self.profile = profile
        self.state = state
        self.trial = _Trial(profile)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[JobId, Status] = {}
        self.unfit: dict[tuple[object, ...], Status] = {}
        self.no_victims: dict[int, Status] = {}
        self.searches: dict[str, int] = defaultdict(int)
        self.failed: dict[tuple[object, ...], Status] = {}
        # Jobs of one queue with equal requests, gang size and priority form a class (numbered here).
        # Once one of them failed without side effects, every later one gets the same status for the
        # rest of the cycle (see `settle_known`): class number -> that status.
        self.classes: dict[tuple[object, ...], int] = {}
        self.known: dict[int, Status] = {}
        # Jobs that may have victims stopping for them: they always take the full path.
        self.claimants = {j for j, victims in state.evicting_for.items() if victims}

    def class_of(self, job: Job) -> int:
        """The job's class number: its queue, request, gang size and priority (one flat tuple: this
        runs for every pending job)."""
        r = job.request
        key = (
            job.queue,
            r.gpus,
            r.gpu_milli,
            r.gpu_memory,
            r.cpu_milli,
            r.memory,
            r.models,
            job.min_workers or job.workers,
            job.priority,
        )
        return self.classes.setdefault(key, len(self.classes))

    def settle_known(self, stack: list[tuple[SortKey, int, Job]]) -> None:
        """Give the next jobs of a queue whose outcome is already known their status, without a turn.

        Caches only grow within a cycle, so a job whose (request, gang, priority) already failed in its
        queue, with no victims found or tried for it, fails again the same way; deciding it changes
        nothing. Taking such jobs off the stack now, before jobs of other queues that rank between them,
        gives the same result as deciding them in their turn."""
        known = self.known
        if not known:
            return
        waiting = self.waiting
        claimants = self.claimants
        while stack:
            _, job_class, job = stack[-1]
            status = known.get(job_class)
            if status is None or job.id in claimants:
                return
            stack.pop()
            waiting[job.id] = status

    def decide(self, job: Job) -> bool:
        """Place the job, preempt for it, or record why it waits. True if placed.

        Within a cycle, free resources and quota only shrink (placements, reservations; victims
        free nothing until they stop), so once a request failed in a queue, the same request in
        the same queue fails again: its status is reused instead of recomputed.
        """
        state = self.state
        failed_key = _request_key(job)
        job_class = self.class_of(job)
        status = self.failed.get(failed_key)
        view: JobView | None = None
        if status is None:
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
            self.failed[failed_key] = status
        outstanding = [v for v in state.evicting_for.get(job.id, ()) if v in state.holdings]
        if outstanding and status.code in (Code.UNSCHEDULABLE, Code.WAIT):
            self._hold_room(job, outstanding)
            self._reserve_quota(job, outstanding)
            self.waiting[job.id] = wait(
                PLUGIN,
                f"waiting for {len(outstanding)} preempted job(s) to stop: {', '.join(sorted(outstanding))}",
                status.message(),
            )
            return False
        if status.code is Code.UNSCHEDULABLE and self.profile.preempt is not None:
            status, settled = self._preempt(job, view, status, job_class)
        else:
            settled = True
        if settled:
            self.known[job_class] = status
        self.waiting[job.id] = status
        return False

    def _preempt(self, job: Job, view: JobView | None, blocked_by: Status, key: int) -> tuple[Status, bool]:
        """Victims for the job, or why none: the status, and whether it holds for every later job of
        the same queue, request, gang size and priority in this cycle (no victims were chosen).

        Cached by the job's class (`key`): what blocked it is the class's one cached failure, so a
        cached answer carries this job's reasons."""
        assert self.profile.preempt is not None
        cached = self.no_victims.get(key)
        if cached is not None:
            return cached, True
        if self.searches[job.queue] >= self.profile.preemption_searches_per_queue:
            # Searches only ever run out within a cycle: the answer holds for every later job like this one.
            deferred = (
                f"preemption not tried this cycle: queue {job.queue} used its {self.searches[job.queue]} searches"
            )
            status = Status(blocked_by.code, (*blocked_by.reasons, deferred), blocked_by.plugin, blocked_by.wake_on)
            self.no_victims[key] = status
            return status, True
        self.searches[job.queue] += 1
        if view is None:
            view = _admit(self.profile, job, self.state)[0]
        choice = self.profile.preempt.preempt(view, self.state, blocked_by, self.trial)
        if not choice.victims:
            self.no_victims[key] = choice.status
            return choice.status, True
        for victim, reason in choice.victims:
            self.state.evicting.add(victim)
            self.state.evicting_for[job.id].append(victim)
            self.preemptions.append(Preemption(victim, job.id, reason))
        victims = [victim for victim, _ in choice.victims]
        self._hold_room(job, victims)
        self._reserve_quota(job, victims)
        return choice.status, False

    def _hold_room(self, job: Job, victims: list[JobId]) -> None:
        """Keep for a preemptor, for the rest of the cycle, the free part of the room it counts on
        (Kubernetes' nominated node): else a job decided later could take it and the victims would
        stop for nothing. The room is where the job lands on a what-if view without its victims."""
        state = self.state
        view = JobView(job, state.table.model_lut(job.request.models))
        with state.without(victims):
            outcome = place_gang(self.profile, view, state, job.gang_size)
            if isinstance(outcome, Status):
                return
            for worker in outcome:
                state.table.apply(worker, +1)
        table = state.table
        for worker in outcome:
            node = table.index[worker.node]
            shares = tuple(
                GpuShare(
                    share.index,
                    min(share.milli, int(table.gpu_milli_free[node, share.index])),
                    min(share.memory, int(table.gpu_mem_free[node, share.index])),
                )
                for share in worker.gpus
                if table.gpu_milli_free[node, share.index] > 0
            )
            held = WorkerPlacement(
                worker.node,
                shares,
                min(worker.cpu_milli, int(table.cpu_free[node])),
                min(worker.memory, int(table.mem_free[node])),
            )
            table.apply(held, -1)

    def _reserve_quota(self, job: Job, victims: list[JobId]) -> None:
        """Hold the quota a job preempted for, so that others of its queue or cohort do not take it
        in the same cycle (else several preemptors overdraw the queue and reclaim ping-pongs).

        Held once: each counter becomes the larger of now (victims still hold their quota) and after
        the victims stopped with the job running (`QuotaLedger.raise_to`)."""
        request = job.request
        n = job.gang_size
        usage = job_usage(request.gpu_milli_total * n, request.cpu_milli * n, request.memory * n, {})
        state = self.state
        ledger = state.ledger
        with state.without(victims):
            ledger.add(job.queue, usage)
            rows, pools = ledger.counters()
            ledger.add(job.queue, usage, sign=-1)
        ledger.raise_to(rows, pools, job.queue)

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


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one cycle.

    A cycle allocates many short-lived objects (sort keys, statuses, placements); each time enough
    pile up, the collector walks the long-lived ones too (snapshot, jobs, holdings), which cost about
    a tenth of a large cycle. Reference counting still frees everything at once; only reference
    cycles wait until the collector runs again after the cycle. Nested or concurrent calls are safe:
    only the call that paused it turns it back on."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def run_cycle(snapshot: ClusterSnapshot, pending: Sequence[Job], profile: Profile) -> CycleResult:
    """Decide one scheduling cycle. Pure: reads its inputs only, returns decisions as data."""
    with _collector_paused():
        return decide(CycleState(snapshot), pending, profile, snapshot.nominated)


def decide(state: CycleState, pending: Sequence[Job], profile: Profile, nominated: Sequence[JobId] = ()) -> CycleResult:
    """`run_cycle` on a working state (built from a snapshot, or forked from a control loop's base).

    The state is consumed: it holds the cycle's decisions afterwards.
    """
    with _collector_paused():
        return _decide(state, pending, profile, nominated)


def _decide(state: CycleState, pending: Sequence[Job], profile: Profile, nominated: Sequence[JobId]) -> CycleResult:
    cycle = _Cycle(state, profile)
    known_queues = set(state.ledger.queues)
    holdings = state.holdings
    first_claims = set(nominated)
    by_queue: dict[str, list[Job]] = defaultdict(list)
    claims: dict[str, list[Job]] = defaultdict(list)
    # Every copy of a duplicated id is refused: deciding one copy would make the result depend on the
    # order of `pending`, and would report the id both placed and in error.
    ids = [job.id for job in pending]
    repeated = {i for i, n in Counter(ids).items() if n > 1} if len(set(ids)) != len(ids) else set()
    for job in pending:
        job_id = job.id
        if job_id in repeated or job_id in holdings:
            cycle.waiting[job_id] = Status(
                Code.ERROR, (f"job {job_id} is pending twice, or pending and running at once",), PLUGIN
            )
            continue
        if known_queues and job.queue not in known_queues:
            cycle.waiting[job_id] = unresolvable(
                PLUGIN,
                f"queue {job.queue} does not exist (queues: {', '.join(sorted(known_queues))})",
            )
            continue
        (claims if job_id in first_claims else by_queue)[job.queue].append(job)

    order = profile.order
    job_key = order.job_key
    classes = cycle.classes
    number = classes.setdefault
    queues: dict[str, list[tuple[SortKey, int, Job]]] = {}
    for name, jobs in by_queue.items():
        # `class_of`, inlined: this runs for every pending job in every cycle.
        keyed = [
            (
                (*job_key(j, state), j.submit_seq, j.id),
                number(
                    (
                        j.queue,
                        j.request.gpus,
                        j.request.gpu_milli,
                        j.request.gpu_memory,
                        j.request.cpu_milli,
                        j.request.memory,
                        j.request.models,
                        j.min_workers or j.workers,
                        j.priority,
                    ),
                    len(classes),
                ),
                j,
            )
            for j in jobs
        ]
        keyed.sort(reverse=True)  # keys are unique (they end with the job id): nothing else is compared
        queues[name] = keyed  # a stack: the next job is last
    queue_keys: dict[str, tuple[int, SortKey]] = {}

    def rank(name: str) -> tuple[SortKey, str]:
        version = state.ledger.version[name]
        cached = queue_keys.get(name)
        if cached is None or cached[0] != version:
            cached = (version, order.queue_key(name, state))
            queue_keys[name] = cached
        return (*cached[1], *queues[name][-1][0]), name

    # Nominated jobs (they preempted for room in an earlier cycle) go first, in submission order.
    for name in sorted(claims):
        for job in sorted(claims[name], key=lambda j: (j.submit_seq, j.id)):
            cycle.decide(job)

    heap = [rank(name) for name in sorted(queues)]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        stack = queues[name]
        _, _, job = stack.pop()
        placed = cycle.decide(job)
        head_status = cycle.waiting.get(job.id)
        if not placed and profile.strict_fifo and head_status is not None and head_status.code is not Code.UNRESOLVABLE:
            # Behind a blocked head, a job can go only when the head can: it waits for the same event.
            behind_head = Status(
                Code.WAIT, (f"behind job {job.id} in queue {name} (strict FIFO)",), PLUGIN, head_status.wake
            )
            verdicts: dict[tuple[object, ...], Status] = {}
            for _, _, behind in stack:
                # A job that can never run says so now, rather than waiting its turn to find out.
                request_key = (behind.request, behind.gang_size)
                verdict = verdicts.get(request_key)
                if verdict is None:
                    verdict = verdicts[request_key] = _admit(profile, behind, state)[1]
                cycle.waiting[behind.id] = verdict if verdict.code is Code.UNRESOLVABLE else behind_head
            stack.clear()
        elif stack and not profile.strict_fifo:
            cycle.settle_known(stack)
        if stack:
            heapq.heappush(heap, rank(name))

    waiting = cycle.waiting
    return CycleResult(tuple(cycle.placements), tuple(cycle.preemptions), {j: waiting[j] for j in sorted(waiting)})
