"""The core's speed shortcuts decide exactly what the plain path decides, on random worlds.

Shortcuts checked: jobs whose outcome is already known in the cycle settled without a turn
(`settle_known`), single-node victim searches skipped when they cannot beat the best set found
(`_lower_bound`), fit tests of a victim search skipped where a per-node bound says no (`_Room`), a
whole-GPU gang's what-if fit counted instead of placed (`known_gang_fit`), what-ifs over many running
jobs applied as arrays (`SHIFT_ARRAYS_FROM`), the gang check's count of workers that fit now kept and
recounted on changed nodes only (`_count_now`), the reprieves not asking again about their last victim
(`last_needed`), a single-worker search asking admission alone while a node it passed on is unchanged
(`_Search.witness`), a gang's reprieve asking admission alone when the victim put back runs only where
no worker of the gang fits (`_Search.placement_unchanged_by`), searches with monotone admission taking
out and putting back victims in runs (`WhatIf.admission_monotone`: the greedy search skipping prefixes
admission refuses, the reprieve putting back runs at once) and shifting their bound over arrays
(`_Room.shift_many`), a cycle's victim searches with the same candidates (`PriorityPreemption.candidates_key`) keeping
them, summed and ranked, less the jobs stopping since (`_Candidates`), node-local
scores kept per request class and recomputed for changed nodes only (`Profile.local_scores`), and the
node table, capacity memo and running-job facts reused from an earlier cycle of the same inventory.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import ClusterSnapshot, Job
from gpufleet.policies.admit import gang as gang_module
from gpufleet.policies.catalog import profile
from gpufleet.policies.preempt import priority as priority_preemption
from gpufleet.scheduling import cycle as cycle_module
from gpufleet.scheduling import placer as placer_module
from gpufleet.scheduling import state as state_module
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.plugin_api import ClusterView, JobView, Profile, Status
from gpufleet.scheduling.state import CycleState, InventoryCache
from tests.kit import cluster, make_job, running_on, without
from tests.property.strategies import World, worlds

PREEMPTING = ("priority", "default", "tiresias")


def _never_prune(*_: object) -> tuple[float, float, float, float]:
    return (-math.inf, -math.inf, -math.inf, -math.inf)


@contextmanager
def _plain() -> Iterator[None]:
    """Every shortcut off: each job takes its turn, every node is searched, what-ifs go job by job,
    every candidate is scored afresh (and nothing is reused from earlier cycles: no inventory cache)."""
    with (
        patch.object(cycle_module._Cycle, "settle_known", lambda self, stack: None),
        patch.object(priority_preemption, "_lower_bound", _never_prune),
        patch.object(priority_preemption._Room, "could_fit", lambda self: True),
        patch.object(priority_preemption._Room, "could_fit_on", lambda self, node: True),
        patch.object(placer_module, "known_gang_fit", lambda *_: None),
        patch.object(state_module, "SHIFT_ARRAYS_FROM", 10**9),
        patch.object(Profile, "local_scores", property(lambda self: False)),
        patch.object(gang_module, "_count_now", _fresh_count),
        patch.object(priority_preemption.PriorityPreemption, "_reprieve", _reprieve_asking_all),
        patch.object(priority_preemption._Search, "fits", _search_fits_asking_all),
        patch.object(priority_preemption._Search, "fits_on", _search_fits_on_asking_all),
        patch.object(priority_preemption._Search, "placement_unchanged_by", lambda self, job_id: False),
        patch.object(cycle_module._WhatIf, "admission_monotone", property(lambda self: False)),
        patch.object(priority_preemption, "ROOM_ARRAYS_FROM", 10**9),
        patch.object(priority_preemption.PriorityPreemption, "candidates_key", _never_kept),
    ):
        yield


def _never_kept(*_: object) -> tuple[object, ...]:
    """A key no other search has: every search builds its candidates afresh."""
    return (object(),)


def _fresh_count(view: JobView, cluster: ClusterView) -> int:
    """The gang check's count of workers that fit now, recounted on every node every time."""
    return int(gang_module._workers_now(view, cluster, None).sum())


_reprieve = priority_preemption.PriorityPreemption._reprieve


def _reprieve_asking_all(
    self: priority_preemption.PriorityPreemption, search: priority_preemption._Search, removed: list[str], **_: bool
) -> list[str]:
    """The reprieve asking again whether the job fits without each victim, the last one taken included."""
    return _reprieve(self, search, removed, last_needed=False)


def _search_fits_asking_all(self: priority_preemption._Search) -> bool:
    """A victim search's fit test asking admission and placement each time (no node known to pass kept). The
    victims taken out in the bound only are taken out of the view first, as `_Search.fits` does."""
    if not self.room.could_fit():
        return False
    self._sync()
    return self.what_if.fits(self.job)


def _search_fits_on_asking_all(self: priority_preemption._Search, node: int) -> bool:
    if not self.room.could_fit_on(node):
        return False
    self._sync()
    return self.what_if.worker_fits(self.job, node) and self.what_if.fits(self.job)


@given(worlds(max_pending=12), st.data())
def test_shortcuts_decide_as_the_plain_path(world: World, data: st.DataObject) -> None:
    policy = profile(world.profile_name)
    with _plain():
        plain = run_cycle(world.snapshot, world.pending, policy).to_json()
    # Arrays from two jobs on, so that the small worlds exercise the vectorised what-if too.
    with patch.object(state_module, "SHIFT_ARRAYS_FROM", 2), patch.object(priority_preemption, "ROOM_ARRAYS_FROM", 2):
        inventory = InventoryCache()
        cold = run_cycle(world.snapshot, world.pending, policy, inventory=inventory).to_json()
        again = run_cycle(world.snapshot, world.pending, policy, inventory=inventory).to_json()
        # Warm from a different cycle of the same inventory: some running jobs gone, the rest the same objects.
        running = sorted(r.id for r in world.snapshot.running)
        gone = data.draw(st.lists(st.sampled_from(running), unique=True) if running else st.just([]))
        run_cycle(without(world.snapshot, gone), world.pending, policy, inventory=inventory)
        warm = run_cycle(world.snapshot, world.pending, policy, inventory=inventory).to_json()
    assert cold == plain
    assert again == plain
    assert warm == plain


@st.composite
def _full_fleets(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[Job]]:
    """Nodes of 8 GPUs full of low-priority jobs (started at different times), and copies of a few
    higher-priority jobs: each copy after the first searches the candidates the first one met."""
    count = draw(st.integers(1, 4))
    fleet = cluster().nodes(count, "A100-80GB", gpus=8)
    running = []
    for n, node in enumerate(fleet.build()):
        gpu = 0
        while gpu < 8:
            size = min(8 - gpu, draw(st.sampled_from((1, 2, 4, 8))))
            job = make_job(f"r{n}-{gpu}").gpus(size).priority(draw(st.integers(0, 2))).build()
            started = float(draw(st.integers(0, 900)))
            running.append(running_on(job, [(node, range(gpu, gpu + size))], started_at=started))
            gpu += size
    pending = []
    for k in range(draw(st.integers(1, 2))):
        gpus = draw(st.sampled_from((1, 2, 4, 8)))
        builder = make_job(f"p{k}").gpus(gpus).priority(draw(st.integers(1, 3))).workers(draw(st.integers(1, 2)))
        job = builder.build()
        pending += [dataclasses.replace(job, id=f"p{k}-{c}", submit_seq=c) for c in range(draw(st.integers(2, 4)))]
    return fleet.snapshot(running=running, now=1000.0), pending


@given(_full_fleets(), st.sampled_from(PREEMPTING))
def test_searches_that_keep_their_candidates_decide_as_searches_that_build_them(
    fleet: tuple[ClusterSnapshot, list[Job]], profile_name: str
) -> None:
    """Copies of a job each search for victims among the same candidates: each later search keeps the first one's
    set, less the victims chosen since, and decides what building it afresh does (never a job stopped twice)."""
    snapshot, pending = fleet
    policy = profile(profile_name)
    with patch.object(priority_preemption.PriorityPreemption, "candidates_key", _never_kept):
        built = run_cycle(snapshot, pending, policy)
    kept = run_cycle(snapshot, pending, policy)
    assert kept.to_json() == built.to_json()
    victims = [p.victim for p in kept.preemptions]
    assert len(victims) == len(set(victims))


@given(worlds(max_pending=12))
def test_a_gang_fit_known_without_placing_is_what_placing_says(world: World) -> None:
    """`known_gang_fit`, where it answers, says what a trial `place_gang` says, and leaves the table as it was."""
    policy = profile(world.profile_name)
    state = CycleState(world.snapshot)
    for job in world.pending:
        for size in {job.gang_size, 2, 3}:
            view = JobView(job, state.table.model_lut(job.request.models))
            before = state.table.gpu_milli_free.copy()
            known = placer_module.known_gang_fit(policy, view, state, size)
            assert (state.table.gpu_milli_free == before).all()
            if known is None:
                continue
            outcome = placer_module.place_gang(policy, view, state, size)
            placed = not isinstance(outcome, Status)
            if placed:
                assert not isinstance(outcome, Status)
                state.table.apply_many(outcome, +1)
            assert known == placed, (job, size)


@given(worlds(max_pending=8), st.data())
def test_the_victim_search_bound_never_says_no_where_the_job_fits(world: World, data: st.DataObject) -> None:
    """`_Room` is an upper bound as a victim search moves: wherever the what-if view says the job (or one
    worker on a node) fits, the bound allows it, before and after taking running jobs out and putting
    them back; so the fit tests it skips would all have said no."""
    policy = profile(world.profile_name)
    state = CycleState(world.snapshot)
    what_if = cycle_module._WhatIf(policy, state)
    running = sorted(r.id for r in world.snapshot.running)
    for job in world.pending:
        search = priority_preemption._Search(job, state.view, what_if)
        taken = data.draw(st.lists(st.sampled_from(running), unique=True) if running else st.just([]))
        back = data.draw(st.lists(st.sampled_from(taken), unique=True) if taken else st.just([]))
        for moves in ((), [(search.remove, j) for j in taken], [(search.restore, j) for j in back]):
            for move, job_id in moves:
                move(job_id)
            if what_if.fits(job):
                assert search.room.could_fit(), job
            for node in range(len(state.table)):
                if what_if.worker_fits(job, node):
                    assert search.room.could_fit_on(node), (job, node)
        for job_id in taken:
            if job_id not in back:
                search.restore(job_id)


@given(worlds(max_pending=8), st.data())
def test_the_kept_gang_count_is_a_fresh_count_as_the_view_changes(world: World, data: st.DataObject) -> None:
    """The gang check's count of workers that fit now, kept across a victim search's moves on the what-if view
    (and placements), is what counting every node afresh gives after each move."""
    policy = profile(world.profile_name)
    state = CycleState(world.snapshot)
    what_if = cycle_module._WhatIf(policy, state)
    running = sorted(r.id for r in world.snapshot.running)
    for job in world.pending:
        view = JobView(job, state.table.model_lut(job.request.models))
        assert gang_module._count_now(view, state.view) == _fresh_count(view, state.view)
        taken = data.draw(st.lists(st.sampled_from(running), unique=True) if running else st.just([]))
        moves = [(what_if.remove, j) for j in taken] + [(what_if.restore, j) for j in reversed(taken)]
        for move, job_id in moves:
            move(job_id)
            assert gang_module._count_now(view, state.view) == _fresh_count(view, state.view), (job, job_id)
        outcome = placer_module.place_gang(policy, view, state, job.gang_size)
        if not isinstance(outcome, Status):  # placed: its nodes changed for the next jobs' counts
            assert gang_module._count_now(view, state.view) == _fresh_count(view, state.view), job


@given(worlds(max_pending=6), st.data())
def test_a_search_bound_shifted_at_once_is_the_bound_shifted_one_by_one(world: World, data: st.DataObject) -> None:
    """`_Room.shift_many` (victims taken out or put back in runs) keeps the per-node bound and its total that
    shifting each holding in turn keeps."""
    running = sorted(r.id for r in world.snapshot.running)
    if not running or not world.pending:
        return
    state = CycleState(world.snapshot)
    job = data.draw(st.sampled_from(world.pending))
    ids = data.draw(st.lists(st.sampled_from(running), unique=True, min_size=1))
    back = data.draw(st.lists(st.sampled_from(ids), unique=True))
    at_once = priority_preemption._Room(job, state.view)
    one_by_one = priority_preemption._Room(job, state.view)
    at_once.shift_many(state.held(ids), +1)
    for job_id in ids:
        one_by_one.shift(state.holdings[job_id], +1)
    assert (at_once.workers, at_once.total) == (one_by_one.workers, one_by_one.total)
    at_once.shift_many(state.held(back), -1)
    for job_id in back:
        one_by_one.shift(state.holdings[job_id], -1)
    assert (at_once.workers, at_once.total) == (one_by_one.workers, one_by_one.total)
    assert at_once.total == sum(at_once.workers)
