"""A reserved start for a job that has waited too long: EASY backfill, as Slurm's backfill scheduler gives its
highest-priority blocked job (Lifka, "The ANL/IBM SP scheduling system", JSSPP 1995; Mu'alem and Feitelson, IEEE
TPDS 12(6), 2001).

Without it, a large gang that does not fit now waits while smaller jobs take each GPU as it frees: it may never
run. With it, once a job has waited `Profile.reserve_after_s`, the cycle decides it before the others; if it does
not fit, the cycle finds the earliest time it would, by the running jobs' run time limits (`run_end`), and the room
it would have then (`reserve`). For the rest of the cycle that room's free part is held from every job except
those that end before that time (`HeadReservation.lets`); jobs elsewhere place as always. Every cycle finds the
reservation again from its own input: the core keeps no state between cycles.

A running job without a run time limit (`RunSpec.max_runtime_s`, else `Job.expected_duration`) has no known end:
a reservation that counts on one is made all the same, with no start time (`start_by` None), and lets no job
into its room: the nodes drain for the waiting job. Such jobs are taken to end in the order they started.
"""

from __future__ import annotations

import math

import numpy as np

from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.domain.snapshot import ReservedStart
from gpufleet.domain.windows import Window, run_limit
from gpufleet.scheduling.placer import place_gang
from gpufleet.scheduling.plugin_api import JobView, Profile, WhatIf
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.table import NodeTable


def run_end(job: Job, started_at: float) -> float | None:
    """When a run started at `started_at` ends at the latest (None: it declares no limit)."""
    limit = run_limit(job)
    return None if limit is None else started_at + limit


def free_part(table: NodeTable, worker: WorkerPlacement) -> WorkerPlacement:
    """The part of a worker's placement that is free in the table now (what holding its room takes)."""
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
    return WorkerPlacement(
        worker.node,
        shares,
        min(worker.cpu_milli, int(table.cpu_free[node])),
        min(worker.memory, int(table.mem_free[node])),
    )


class RoomHold:
    """Room (`workers`) whose free part is held in the cycle's table from every job it does not `lets` in. The cycle
    gives it back for the turn of a job it lets in (`release`), then holds what is free of it again (`hold`)."""

    def __init__(self, workers: tuple[WorkerPlacement, ...]) -> None:
        self.workers = workers
        self.held: list[WorkerPlacement] = []

    def hold(self, table: NodeTable) -> None:
        """Take the room's free part out of the table (no job placed now can use it)."""
        assert not self.held, "held twice"
        for worker in self.workers:
            part = free_part(table, worker)
            table.apply(part, -1)
            self.held.append(part)

    def release(self, table: NodeTable) -> None:
        """Give the held part back."""
        for part in self.held:
            table.apply(part, +1)
        self.held.clear()

    def lets(self, job: Job, now: float) -> bool:
        raise NotImplementedError

    def note(self, now: float) -> str | None:
        """What a job it keeps out should be told (None: nothing; the room is no admin's)."""
        return None


class HeadReservation(RoomHold):
    """The room a waiting job will have at `start_by` (`workers`): only jobs that end before then may use it."""

    def __init__(
        self, job: Job, start_by: float | None, workers: tuple[WorkerPlacement, ...], waits_for: tuple[JobId, ...]
    ) -> None:
        super().__init__(workers)
        self.job = job
        self.start_by = start_by
        self.waits_for = waits_for

    def lets(self, job: Job, now: float) -> bool:
        """Whether `job`, started now, ends before the reserved start (so it may use the room until then)."""
        if self.start_by is None:
            return False
        end = run_end(job, now)
        return end is not None and end <= self.start_by

    def result(self) -> ReservedStart:
        nodes = tuple(sorted({worker.node for worker in self.workers}))
        return ReservedStart(self.job.id, self.start_by, nodes, self.waits_for)

    def describe(self) -> str:
        nodes = ", ".join(sorted({worker.node for worker in self.workers}))
        ending = f"{len(self.waits_for)} running job(s) end" if self.waits_for else "its room is free"
        if self.start_by is None:
            return (
                f"reserved: {nodes} drained for it until {ending} (one of them declares no run time limit, so "
                "no job may use the room meanwhile)"
            )
        return f"reserved: starts by t={self.start_by:.0f} on {nodes}, when {ending}; shorter jobs may use the room"


class WindowHold(RoomHold):
    """An admin's window on nodes (`domain/windows.py`): every free resource of its nodes held from the jobs it does
    not let in (those that would still run at its start, or of another queue during it)."""

    def __init__(self, window: Window, table: NodeTable) -> None:
        workers = []
        for name in window.nodes:
            node = table.index.get(name)
            if node is None:
                continue  # a node no longer in the fleet
            shares = tuple(
                GpuShare(int(i), MILLI_PER_GPU, int(table.gpu_mem_total[node, i]))
                for i in np.flatnonzero(table.gpu_exists[node])
            )
            workers.append(WorkerPlacement(name, shares, int(table.cpu_total[node]), int(table.mem_total[node])))
        super().__init__(tuple(workers))
        self.window = window

    def lets(self, job: Job, now: float) -> bool:
        return self.window.lets(job, now)

    def note(self, now: float) -> str | None:
        window = self.window
        nodes = ", ".join(window.nodes)
        if now >= window.start:
            return f"{window.describe()} holds {nodes}" + ("" if window.maintenance else " for its queue only")
        return f"{window.describe()} holds {nodes} for jobs whose max_runtime ends them by t={window.start:.0f}"


def _ends(state: CycleState) -> list[tuple[float, float, JobId]]:
    """Every job holding resources with when it ends: stopping ones now, others by their limit (inf: none)."""
    now = state.now
    found = []
    for job_id, holding in state.holdings.items():
        started = holding.running.started_at if holding.running is not None else now
        if job_id in state.evicting:
            end: float | None = now
        else:
            end = run_end(holding.job, started)
        found.append((math.inf if end is None else max(end, now), started, job_id))
    found.sort()
    return found


def reserve(profile: Profile, job: Job, state: CycleState, what_if: WhatIf) -> HeadReservation | None:
    """The earliest start of `job` by the running jobs' ends, and its room then; None if it would not fit even
    once every running job ended (its quota, or nodes that cannot hold it)."""
    ends = _ends(state)
    ids = [job_id for _, _, job_id in ends]
    with state.without(ids):
        if not what_if.fits(job):
            return None
    # The fewest first-ending jobs whose end lets it in: removing more only frees more, so search by halves.
    low, high = 0, len(ids)
    while low < high:
        middle = (low + high) // 2
        with state.without(ids[:middle]):
            fits = what_if.fits(job)
        if fits:
            high = middle
        else:
            low = middle + 1
    waits_for = ids[:low]
    with state.without(waits_for):
        view = JobView(job, state.table.model_lut(job.request.models))
        outcome = place_gang(profile, view, state, job.gang_size)
        if isinstance(outcome, tuple):
            for worker in outcome:  # placed on the what-if view only to read it: given back at once
                state.table.apply(worker, +1)
    if not isinstance(outcome, tuple):
        return None
    last = ends[low - 1][0] if low else state.now
    start_by = None if math.isinf(last) else last
    return HeadReservation(job, start_by, outcome, tuple(sorted(waits_for)))
