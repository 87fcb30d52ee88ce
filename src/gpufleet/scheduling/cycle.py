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
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import numpy as np

from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.snapshot import ClusterSnapshot, Migration, Placement, Preemption, ReservedStart
from gpufleet.scheduling.classes import JobClass, PlacementClass, RequestClass, placement_class
from gpufleet.scheduling.ledger import job_usage
from gpufleet.scheduling.placer import evaluate, fits, place_gang, place_worker
from gpufleet.scheduling.plugin_api import GangContext, JobView, Profile, RunEstimate, SortKey
from gpufleet.scheduling.reservation import HeadReservation, RoomHold, WindowHold, free_part, reserve
from gpufleet.scheduling.state import CycleState, InventoryCache
from gpufleet.scheduling.status import Code, Status, unresolvable, wait
from gpufleet.scheduling.table import WorkerArrays

PLUGIN = "cycle"


@dataclass(frozen=True, slots=True)
class CycleResult:
    placements: tuple[Placement, ...]
    preemptions: tuple[Preemption, ...]
    waiting: Mapping[JobId, Status]
    migrations: tuple[Migration, ...] = ()  # running jobs the profile moves (`Profile.migrate`)
    reserved_starts: tuple[ReservedStart, ...] = ()  # starts reserved for jobs that waited too long (`reservation.py`)

    def to_json(self) -> str:
        """Canonical serialisation: equal results give equal strings (`migrations` and `reserved_starts` only when
        there are any)."""
        moved = {"migrations": [dataclasses.asdict(m) for m in self.migrations]} if self.migrations else {}
        reserved = (
            {"reserved_starts": [dataclasses.asdict(r) for r in self.reserved_starts]} if self.reserved_starts else {}
        )
        return json.dumps(
            {
                **moved,
                **reserved,
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


class _WhatIf:
    """Preemption's what-if capability (`api.WhatIf`) on the cycle's working state: admission and placement
    tried on the current view and undone, and running jobs taken out and put back."""

    def __init__(self, profile: Profile, state: CycleState) -> None:
        self.profile = profile
        self.state = state

    def remove(self, job_id: JobId) -> None:
        self.state.remove(job_id)

    def restore(self, job_id: JobId) -> None:
        self.state.restore(job_id)

    def remove_many(self, job_ids: list[JobId]) -> None:
        self.state.remove_many(job_ids)

    def restore_many(self, job_ids: list[JobId]) -> None:
        self.state.restore_many(job_ids)

    @property
    def admission_monotone(self) -> bool:
        return all(getattr(plugin, "monotone", False) for plugin in self.profile.admit)

    def without(self, job_ids: list[JobId]) -> AbstractContextManager[None]:
        return self.state.without(job_ids)

    def held(self, job_ids: list[JobId]) -> WorkerArrays:
        return self.state.held(job_ids)

    def admits(self, job: Job) -> Status:
        return _admit(self.profile, job, self.state)[1]

    def fits(self, job: Job) -> bool:
        state = self.state
        view, status = _admit(self.profile, job, state)
        if not status.ok:
            return False
        if job.gang_size == 1:
            # One worker is placed exactly when some node passes the filters: no need to place it.
            return bool(evaluate(self.profile, view, state).passed.any())
        return fits(self.profile, view, state, job.gang_size)

    def worker_fits(self, job: Job, node: int) -> bool:
        # The class's cached filter results, refreshed where nodes changed, are the filters run on `node`.
        state = self.state
        view = JobView(job, state.table.model_lut(job.request.models))
        return bool(evaluate(self.profile, view, state).passed[node])

    def passing_node(self, job: Job) -> int | None:
        state = self.state
        view = JobView(job, state.table.model_lut(job.request.models))
        passed = evaluate(self.profile, view, state).passed
        node = int(passed.argmax())
        return node if passed[node] else None


def _admit(profile: Profile, job: Job, state: CycleState) -> tuple[JobView, Status]:
    view = JobView(job, state.table.model_lut(job.request.models))
    cluster = state.view
    for plugin in profile.admit:
        status = plugin.admit(view, cluster)
        if not status.ok:
            return view, status
    return view, Status(Code.SUCCESS)


Stack = list[tuple[SortKey, int, Job]]  # a queue's jobs in order (the next one last), with their job class number


class _Cycle:
    def __init__(self, state: CycleState, profile: Profile) -> None:
        self.profile = profile
        self.state = state
        self.view = state.view  # held for the cycle: the state refers to its view weakly
        self.what_if = _WhatIf(profile, state)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[JobId, Status] = {}
        # Caches of outcomes, each named by what it is keyed by (see `gpufleet.scheduling.classes`).
        self.failed_requests: dict[RequestClass, Status] = {}
        self.unfit_placements: dict[PlacementClass, Status] = {}
        # Job classes, numbered in order of appearance; by number: an outcome known to hold for the rest of
        # the cycle (see `settle_known`), and a preemption search that found no victims.
        self.job_class_numbers: dict[JobClass, int] = {}
        self.job_classes: list[JobClass] = []
        self.known_outcomes: dict[int, Status] = {}
        self.victimless: dict[int, Status] = {}
        self.searches: dict[str, int] = defaultdict(int)
        # Jobs that may have victims stopping for them: they always take the full path.
        self.claimants = {j for j, victims in state.evicting_for.items() if victims}
        # Room held from most jobs: the nodes of an admin's windows (maintenance, or held for a queue), and the
        # start reserved in this cycle for a job that waited too long. A job some of it lets in takes the full path
        # with that room given back for its turn (the caches hold for the others only).
        self.reservation: HeadReservation | None = None
        self.holds: list[RoomHold] = []
        for window in state.snapshot.windows:
            if not window.over(state.now):
                self.hold(WindowHold(window, state.table))

    def hold(self, room: RoomHold) -> None:
        room.hold(self.state.table)
        self.holds.append(room)

    def lets_in(self, job: Job) -> bool:
        """Whether some held room lets the job in (it ends before the reserved start, or the window allows it)."""
        now = self.state.now
        return any(room.lets(job, now) for room in self.holds)

    def number(self, job_class: JobClass) -> int:
        """The job class's number (given in order of first appearance)."""
        numbers = self.job_class_numbers
        return numbers.setdefault(job_class, len(numbers))

    def job_class(self, number: int) -> JobClass:
        classes = self.job_classes
        if number >= len(classes):  # numbered since last asked: the dict keeps the order they were numbered in
            classes = self.job_classes = list(self.job_class_numbers)
        return classes[number]

    def settle_known(self, stack: Stack) -> None:
        """Give the next jobs of a queue whose outcome is already known their status, without a turn.

        Caches only grow within a cycle, so a job whose (request, gang, priority) already failed in its
        queue, with no victims found or tried for it, fails again the same way; deciding it changes
        nothing. Taking such jobs off the stack now, before jobs of other queues that rank between them,
        gives the same result as deciding them in their turn."""
        known = self.known_outcomes
        if not known:
            return
        waiting = self.waiting
        claimants = self.claimants
        while stack:
            _, job_class, job = stack[-1]
            status = known.get(job_class)
            if status is None or job.id in claimants or self.lets_in(job):
                return
            stack.pop()
            waiting[job.id] = status

    def decide(self, job: Job, job_class: int) -> bool:
        """Place the job, preempt for it, or record why it waits. True if placed.

        Within a cycle, free resources and quota only shrink (placements, reservations; victims
        free nothing until they stop), so once a request failed in a queue, the same request in
        the same queue fails again: its status is reused instead of recomputed.
        """
        if self.lets_in(job):
            return self._decide_in_reserved_room(job, job_class)
        return self._decide(job, job_class, self.profile.job_specific)

    def _decide_in_reserved_room(self, job: Job, job_class: int) -> bool:
        """Decide a job some held room lets in, with that room given back for its turn. Its outcome is its own: it
        neither reads nor fills the caches, which hold for jobs without that room."""
        now = self.state.now
        table = self.state.table
        given = [room for room in self.holds if room.lets(job, now)]
        for room in reversed(given):
            room.release(table)
        try:
            return self._decide(job, job_class, True)
        finally:
            for room in given:
                room.hold(table)

    def _decide(self, job: Job, job_class: int, job_specific: bool) -> bool:
        state = self.state
        request_class = self.job_class(job_class).request_class
        status = None if job_specific else self.failed_requests.get(request_class)
        view: JobView | None = None
        if status is None:
            view, status = self._try(job, job_specific)
            if status is None:
                return True
            status = self._noting_holds(job, status)
            if not job_specific:
                self.failed_requests[request_class] = status
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
            status, settled = self._preempt(job, view, status, job_class, job_specific)
        else:
            settled = True
        if settled and not job_specific:
            self.known_outcomes[job_class] = status
        self.waiting[job.id] = status
        return False

    def _noting_holds(self, job: Job, status: Status) -> Status:
        """The status with what an admin's windows that keep the job out say (why the room looks taken)."""
        now = self.state.now
        notes = [note for room in self.holds if room.held and not room.lets(job, now) and (note := room.note(now))]
        if not notes or status.code is Code.UNRESOLVABLE:
            return status
        return Status(status.code, (*status.reasons, *notes), status.plugin, status.wake_on)

    def _try(self, job: Job, job_specific: bool) -> tuple[JobView, Status | None]:
        """Admit and place the job (None: placed and committed), or why it does not fit now."""
        view, status = _admit(self.profile, job, self.state)
        if not status.ok:
            return view, status
        key = placement_class(job, view.model_lut.tobytes())
        cached = None if job_specific else self.unfit_placements.get(key)
        if cached is not None:
            return view, cached
        outcome = place_gang(self.profile, view, self.state, job.gang_size)
        if isinstance(outcome, Status):
            if not job_specific:
                self.unfit_placements[key] = outcome
            return view, outcome
        self._commit(job, outcome)
        return view, None

    def _preempt(
        self, job: Job, view: JobView | None, blocked_by: Status, job_class: int, job_specific: bool
    ) -> tuple[Status, bool]:
        """Victims for the job, or why none: the status, and whether it holds for every later job of
        the same job class in this cycle (no victims were chosen).

        Cached by the job's class: what blocked it is the request class's one cached failure, so a
        cached answer carries this job's reasons."""
        assert self.profile.preempt is not None
        cached = None if job_specific else self.victimless.get(job_class)
        if cached is not None:
            return cached, True
        if self.searches[job.queue] >= self.profile.preemption_searches_per_queue:
            # Searches only ever run out within a cycle: the answer holds for every later job like this one.
            deferred = (
                f"preemption not tried this cycle: queue {job.queue} used its {self.searches[job.queue]} searches"
            )
            status = Status(blocked_by.code, (*blocked_by.reasons, deferred), blocked_by.plugin, blocked_by.wake_on)
            self.victimless[job_class] = status
            return status, True
        self.searches[job.queue] += 1
        if view is None:
            view = _admit(self.profile, job, self.state)[0]
        choice = self.profile.preempt.preempt(view, self.state.view, blocked_by, self.what_if)
        if not choice.victims:
            if not job_specific:
                self.victimless[job_class] = choice.status
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
            table.apply(free_part(table, worker), -1)

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
        """Add workers to an elastic job beyond its minimum while they fit on the nodes its gang already uses, quota
        included: it starts compact, and the resize step grows it later (re-placing it onto fewer nodes)."""
        state = self.state
        single = dataclasses.replace(job, workers=1, min_workers=None)
        context = GangContext([state.table.index[w.node] for w in state.holdings[job.id].workers])
        only = np.zeros(len(state.table), dtype=bool)  # on the nodes of its gang: later grows gather
        only[context.nodes] = True
        for _ in range(job.workers - job.gang_size):
            view, status = _admit(self.profile, single, state)
            if not status.ok:
                return
            outcome = place_worker(self.profile, view, state, context, only)
            if isinstance(outcome, Status):
                return
            state.extend(job.id, outcome)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one cycle (the control loop: for one whole step).

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


def run_cycle(
    snapshot: ClusterSnapshot,
    pending: Sequence[Job],
    profile: Profile,
    *,
    estimates: Mapping[JobId, RunEstimate] | None = None,
    inventory: InventoryCache | None = None,
) -> CycleResult:
    """Decide one scheduling cycle. Pure: reads its inputs only, returns decisions as data.

    `estimates`: what the profile's learner predicted for pending jobs (run times learned from finished jobs);
    without them, jobs count at the order's prior. `inventory`: a cache the caller keeps across calls on the
    same node inventory (speed only: the result is the same without it)."""
    with collector_paused():
        return decide(CycleState(snapshot, inventory, estimates), pending, profile, snapshot.nominated)


def decide(state: CycleState, pending: Sequence[Job], profile: Profile, nominated: Sequence[JobId] = ()) -> CycleResult:
    """`run_cycle` on a working state (built from a snapshot, or copied from a control loop's state).

    The state is consumed: it holds the cycle's decisions afterwards.
    """
    with collector_paused():
        state.pending = tuple(pending)
        cycle = _Cycle(state, profile)
        claims, by_queue = _intake(cycle, pending, set(nominated))
        queues = _ordered(cycle, by_queue)  # keyed before anything is decided: keys see the cycle's input
        _decide_claims(cycle, claims)
        if profile.reserve_after_s is not None:
            _decide_starving(cycle, queues, profile.reserve_after_s)
        _decide_in_order(cycle, queues)
        migrations = _migrations(cycle)
        waiting = cycle.waiting
        reserved = (cycle.reservation.result(),) if cycle.reservation is not None else ()
        return CycleResult(
            tuple(cycle.placements),
            tuple(cycle.preemptions),
            {j: waiting[j] for j in sorted(waiting)},
            migrations,
            reserved,
        )


def _migrations(cycle: _Cycle) -> tuple[Migration, ...]:
    """The running jobs the profile moves, asked once every pending job was decided (so a move never takes GPUs a
    preemption counted on): each is marked stopping, once, unless it is stopping already or was placed in this
    cycle."""
    plugin = cycle.profile.migrate
    if plugin is None:
        return ()
    state = cycle.state
    placed = {p.job for p in cycle.placements}
    moved: list[Migration] = []
    for job_id, reason in plugin.migrations(state.view):
        if job_id in state.evicting or job_id in placed or job_id not in state.holdings:
            continue
        state.evicting.add(job_id)
        moved.append(Migration(job_id, reason))
    return tuple(moved)


def _intake(
    cycle: _Cycle, pending: Sequence[Job], first_claims: set[JobId]
) -> tuple[dict[str, list[Job]], dict[str, list[Job]]]:
    """Pending jobs by queue: nominated ones (`first_claims`) apart. Jobs that cannot be decided are refused
    here: an id pending twice, or pending and running at once (deciding one copy would make the result depend
    on the order of `pending`, and report the id both placed and in error), and jobs of unknown queues."""
    known_queues = set(cycle.state.ledger.queues)
    holdings = cycle.state.holdings
    by_queue: dict[str, list[Job]] = defaultdict(list)
    claims: dict[str, list[Job]] = defaultdict(list)
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
    return claims, by_queue


def _decide_claims(cycle: _Cycle, claims: dict[str, list[Job]]) -> None:
    """Nominated jobs (they preempted for room in an earlier cycle) go first, in submission order."""
    for name in sorted(claims):
        for job in sorted(claims[name], key=lambda j: (j.submit_seq, j.id)):
            cycle.decide(job, cycle.number(JobClass.of(job)))


def _ordered(cycle: _Cycle, by_queue: dict[str, list[Job]]) -> dict[str, Stack]:
    """Each queue's jobs in the order plugin's order, as a stack (the next job last)."""
    cluster = cycle.state.view
    job_key = cycle.profile.order.job_key
    numbers = cycle.job_class_numbers
    number = numbers.setdefault  # `_Cycle.number`, inlined: this runs for every pending job in every cycle
    of = JobClass.of
    queues: dict[str, Stack] = {}
    for name, jobs in by_queue.items():
        keyed = [((*job_key(j, cluster), j.submit_seq, j.id), number(of(j), len(numbers)), j) for j in jobs]
        keyed.sort(reverse=True)  # keys are unique (they end with the job id): nothing else is compared
        queues[name] = keyed
    return queues


def _starving(queues: dict[str, Stack], cutoff: float) -> tuple[str, int] | None:
    """The job that has waited longest of those submitted at `cutoff` or before and of their queue's highest
    pending priority (age does not overtake priority; it does overtake the order inside a priority, which may
    put small jobs first for ever): its queue and place in its stack."""
    found: tuple[tuple[float, int, str], str, int] | None = None
    for name in sorted(queues):
        stack = queues[name]
        highest = max(job.priority for _, _, job in stack)
        for place, (_, _, job) in enumerate(stack):
            if job.priority == highest and job.submitted_at <= cutoff:
                key = (job.submitted_at, job.submit_seq, job.id)
                if found is None or key < found[0]:
                    found = (key, name, place)
    return None if found is None else (found[1], found[2])


def _decide_starving(cycle: _Cycle, queues: dict[str, Stack], reserve_after_s: float) -> None:
    """The job that has waited past `reserve_after_s` longest goes before the others; if it cannot start, it gets
    a reserved start (`reservation.py`) whose room the jobs decided after it may use only if they end first."""
    state = cycle.state
    starving = _starving(queues, state.now - reserve_after_s)
    if starving is None:
        return
    name, place = starving
    _, job_class, job = queues[name].pop(place)
    if not queues[name]:
        del queues[name]
    if cycle.decide(job, job_class):
        return
    status = cycle.waiting[job.id]
    if status.code is not Code.UNSCHEDULABLE or state.evicting_for.get(job.id):
        return  # it can never run, or victims are stopping for it (their room is held for it already)
    view = JobView(job, state.table.model_lut(job.request.models))
    for plugin in cycle.profile.admit:
        if getattr(plugin, "checks_quota", False) and not plugin.admit(view, state.view).ok:
            # It waits for its queue's own jobs to end (quota), not for room: holding room for it would keep every
            # other queue off that room for nothing.
            return
    reservation = reserve(cycle.profile, job, state, cycle.what_if)
    if reservation is None:
        return
    cycle.hold(reservation)
    cycle._reserve_quota(job, list(reservation.waits_for))
    cycle.reservation = reservation
    cycle.waiting[job.id] = Status(
        status.code, (*status.reasons, reservation.describe()), status.plugin, status.wake_on
    )


def _decide_in_order(cycle: _Cycle, queues: dict[str, Stack]) -> None:
    """Decide queue heads in the order of the queues' ranks (re-read when a queue's usage changed) until
    every queue is empty."""
    state = cycle.state
    profile = cycle.profile
    queue_key = profile.order.queue_key
    queue_keys: dict[str, tuple[int, SortKey]] = {}

    def rank(name: str) -> tuple[SortKey, str]:
        version = state.ledger.version[name]
        cached = queue_keys.get(name)
        if cached is None or cached[0] != version:
            cached = (version, queue_key(name, state.view))
            queue_keys[name] = cached
        return (*cached[1], *queues[name][-1][0]), name

    heap = [rank(name) for name in sorted(queues)]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        stack = queues[name]
        _, job_class, job = stack.pop()
        placed = cycle.decide(job, job_class)
        head_status = cycle.waiting.get(job.id)
        if not placed and profile.strict_fifo and head_status is not None and head_status.code is not Code.UNRESOLVABLE:
            _hold_behind_head(cycle, name, job, head_status, stack)
        elif stack and not profile.strict_fifo:
            cycle.settle_known(stack)
        if stack:
            heapq.heappush(heap, rank(name))


def _hold_behind_head(cycle: _Cycle, queue: str, head: Job, head_status: Status, stack: Stack) -> None:
    """Strict FIFO: behind a blocked head, a job can go only when the head can: it waits for the same event.
    A job that can never run says so now, rather than waiting its turn to find out."""
    behind_head = Status(Code.WAIT, (f"behind job {head.id} in queue {queue} (strict FIFO)",), PLUGIN, head_status.wake)
    admission: dict[RequestClass, Status] = {}
    for _, job_class, behind in stack:
        request_class = cycle.job_class(job_class).request_class
        verdict = admission.get(request_class)
        if verdict is None:
            verdict = admission[request_class] = _admit(cycle.profile, behind, cycle.state)[1]
        cycle.waiting[behind.id] = verdict if verdict.code is Code.UNRESOLVABLE else behind_head
    stack.clear()
