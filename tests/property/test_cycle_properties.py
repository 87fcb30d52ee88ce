"""Invariants of `run_cycle` on random worlds, for every named profile."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import Job, WorkerRequest
from gpufleet.policies.catalog import profile
from gpufleet.policies.preempt.las import LasPreemption
from gpufleet.scheduling.cycle import _WhatIf, run_cycle
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.status import Code, unschedulable
from tests.kit import advance, check_all, fingerprint, still_pending, view_of, without
from tests.property.strategies import ABSENT_MODEL, PROFILE_NAMES, World, worlds

PREEMPTING = tuple(name for name in PROFILE_NAMES if profile(name).preempt is not None)
NON_STRICT = tuple(name for name in PROFILE_NAMES if not profile(name).strict_fifo)


@given(worlds())
def test_every_result_keeps_the_invariants(world: World) -> None:
    """Capacity, quota, gang, target, partition and victim invariants (tests.kit.invariants)."""
    policy = profile(world.profile_name)
    result = run_cycle(world.snapshot, world.pending, policy)
    check_all(world.snapshot, world.pending, result, policy)


@given(worlds(profile_names=PREEMPTING, max_pending=12))
def test_every_preemption_makes_room(world: World) -> None:
    """Once its victims stop, the preemptor fits (same profile, nothing else pending)."""
    policy = profile(world.profile_name)
    result = run_cycle(world.snapshot, world.pending, policy)
    check_all(world.snapshot, world.pending, result, policy)
    by_job: dict[str, list[str]] = {}
    for p in result.preemptions:
        by_job.setdefault(p.for_job, []).append(p.victim)
    jobs = {j.id: j for j in world.pending}
    for job_id, gone in sorted(by_job.items()):
        after = run_cycle(without(world.snapshot, gone), [jobs[job_id]], policy)
        assert [p.job for p in after.placements] == [job_id], (
            f"{job_id} preempted {gone} and still does not fit: {after.waiting.get(job_id)}"
        )


LAS_PREEMPTING = tuple(name for name in PROFILE_NAMES if isinstance(profile(name).preempt, LasPreemption))


@given(worlds(profile_names=LAS_PREEMPTING, max_pending=12, pressure=True), st.data())
def test_las_preemption_keeps_the_invariants_and_makes_room(world: World, data: st.DataObject) -> None:
    """Equal priorities and long-running jobs, so that LAS bands decide who is stopped: victims are of the
    preemptor's queue with more service (or lower priority, or reclaimed), and the preemptor then fits."""
    policy = profile(world.profile_name)
    long_ago = [
        dataclasses.replace(r, started_at=float(data.draw(st.sampled_from((0, 0, 500, 950)))))
        for r in world.snapshot.running
    ]
    flat = [dataclasses.replace(r, job=dataclasses.replace(r.job, priority=0)) for r in long_ago]
    pending = [dataclasses.replace(j, priority=0, attained_gpu_seconds=0.0) for j in world.pending]
    snapshot = dataclasses.replace(world.snapshot, running=tuple(flat))
    result = run_cycle(snapshot, pending, policy)
    check_all(snapshot, pending, result, policy)
    jobs = {j.id: j for j in pending}
    by_job: dict[str, list[str]] = {}
    for p in result.preemptions:
        by_job.setdefault(p.for_job, []).append(p.victim)
    for job_id, gone in sorted(by_job.items()):
        after = run_cycle(without(snapshot, gone), [jobs[job_id]], policy)
        assert [p.job for p in after.placements] == [job_id], f"{job_id} preempted {gone} and still does not fit"


@given(worlds(), st.randoms(use_true_random=False))
def test_same_input_same_bytes_in_any_order(world: World, rnd: random.Random) -> None:
    """Byte-identical results for the same input, and for the same sets listed in another order
    (pending jobs, running jobs, nodes, queues): the core groups and sorts with total keys."""
    policy = profile(world.profile_name)
    first = run_cycle(world.snapshot, world.pending, policy).to_json()
    assert run_cycle(world.snapshot, world.pending, profile(world.profile_name)).to_json() == first
    pending = list(world.pending)
    rnd.shuffle(pending)
    assert run_cycle(world.snapshot, pending, policy).to_json() == first
    running, nodes, queues = list(world.snapshot.running), list(world.snapshot.nodes), list(world.snapshot.queues)
    for items in (running, nodes, queues):
        rnd.shuffle(items)
    reordered = dataclasses.replace(world.snapshot, running=tuple(running), nodes=tuple(nodes), queues=tuple(queues))
    assert run_cycle(reordered, pending, policy).to_json() == first


IMPOSSIBLE = ("too_many_gpus", "absent_model", "gang_too_big", "gpu_memory", "cpu")


@given(worlds(max_pending=6), st.sampled_from(IMPOSSIBLE), st.integers(1, 4), st.integers(0, 50), st.integers(0, 4))
def test_an_impossible_request_is_unresolvable(
    world: World, how: str, extra: int, submitted_at: int, priority: int
) -> None:
    """Wherever it stands in its queue (strict FIFO included), it is told at once that it can never run."""
    nodes = world.snapshot.nodes
    most_gpus = max(len(n.gpus) for n in nodes)
    if how == "too_many_gpus":
        request = WorkerRequest(gpus=most_gpus + extra)
        workers = 1
    elif how == "absent_model":
        request = WorkerRequest(gpus=1, models=frozenset({ABSENT_MODEL}))
        workers = 1
    elif how == "gang_too_big":
        per_worker = min(extra, most_gpus)
        request = WorkerRequest(gpus=per_worker)
        workers = sum(len(n.gpus) // per_worker for n in nodes) + 1
    elif how == "gpu_memory":
        biggest = max(g.memory for n in nodes for g in n.gpus)
        request = WorkerRequest(gpus=1, gpu_memory=biggest + extra)
        workers = 1
    else:
        request = WorkerRequest(gpus=0, cpu_milli=max(n.cpu_milli for n in nodes) + extra)
        workers = 1
    queue = world.pending[0].queue if world.pending else (world.snapshot.queues or [None])[0]
    queue_name = queue if isinstance(queue, str) else (queue.name if queue is not None else "team-a")
    job = Job(
        "impossible",
        queue_name,
        request,
        workers=workers,
        priority=priority,
        submit_seq=submitted_at,
        submitted_at=float(submitted_at),
    )
    pending = [job, *world.pending]
    policy = profile(world.profile_name)
    result = run_cycle(world.snapshot, pending, policy)
    check_all(world.snapshot, pending, result, policy)
    status = result.waiting["impossible"]
    assert status.code is Code.UNRESOLVABLE, status
    assert status.reasons
    assert status.reasons[0]
    assert not any(p.for_job == "impossible" for p in result.preemptions)


@given(worlds(max_pending=10), st.integers(2, 4), st.data())
def test_invariants_hold_over_several_cycles(world: World, cycles: int, data: st.DataObject) -> None:
    """Decisions applied between cycles (placements start, victims evict, some victims stop): every
    next cycle still keeps the invariants."""
    policy = profile(world.profile_name)
    snapshot, pending = world.snapshot, list(world.pending)
    for _ in range(cycles):
        result = run_cycle(snapshot, pending, policy)
        check_all(snapshot, pending, result, policy)
        snapshot = advance(snapshot, result, pending, now=snapshot.now + 60.0)
        pending = still_pending(pending, result)
        evicting = sorted(r.id for r in snapshot.running if r.evicting)
        stopped = data.draw(st.lists(st.sampled_from(evicting), unique=True) if evicting else st.just([]))
        snapshot = without(snapshot, stopped)


@given(worlds(profile_names=NON_STRICT))
def test_no_job_is_left_waiting_that_would_fit_at_the_end(world: World) -> None:
    """Free resources and quota only shrink during a cycle, so a job that did not fit when its turn came
    does not fit in the end state either (this checks every shortcut the core takes: cached verdicts,
    incremental filtering, gang pre-checks). Backfilling profiles only: strict FIFO holds jobs on purpose."""
    policy = profile(world.profile_name)
    result = run_cycle(world.snapshot, world.pending, policy)
    ids = {j.id for j in world.pending}
    outstanding = any(r.evicting_for in ids for r in world.snapshot.running)
    if result.preemptions or outstanding:
        return  # room and quota held for preemptors are not in the end state; the comparison would be unfair
    probe_nodes = {n.name for n in world.snapshot.nodes if n.admits == "probe"}
    if any(w.node in probe_nodes for p in result.placements for w in p.workers):
        return  # a half-open pool took its one probe: shut for the rest of the cycle, open in the end state
    end = advance(world.snapshot, result, world.pending)
    for job in world.pending:
        status = result.waiting.get(job.id)
        if status is None or status.code not in (Code.UNSCHEDULABLE, Code.WAIT):
            continue
        again = run_cycle(end, [job], policy)
        assert not again.placements, f"{job.id} waited ({status.message()}) but fits at the end of the cycle"


@given(worlds(profile_names=PREEMPTING))
def test_preemption_search_restores_the_what_if_view_exactly(world: World) -> None:
    policy = profile(world.profile_name)
    assert policy.preempt is not None
    state = CycleState(world.snapshot)
    what_if = _WhatIf(policy, state)
    before = fingerprint(state)
    for job in world.pending:
        if what_if.fits(job):
            continue  # the core asks for victims only for jobs that do not fit
        assert fingerprint(state) == before
        blocked = unschedulable("test", "does not fit")
        policy.preempt.preempt(view_of(job, state), state.view, blocked, what_if)
        assert fingerprint(state) == before, f"preempting for {job.id} left the view changed"
        assert not state.removed


def _full_fingerprint(state: CycleState) -> tuple[bytes, ...]:
    """`fingerprint` with the node totals and the cohorts' pooled usage too."""
    pools = sorted((k, v) for k, v in state.ledger.pool_used.items() if v)
    return (*fingerprint(state), state.table.node_milli_free.tobytes(), repr(pools).encode())


@given(worlds(profile_names=PREEMPTING), st.data())
def test_running_jobs_taken_out_and_put_back_at_once_leave_the_view_of_one_by_one(
    world: World, data: st.DataObject
) -> None:
    """`remove_many` / `restore_many` (what a search takes out or puts back in runs) give the view that removing
    or restoring each job in turn gives, and date every node they touch as changed."""
    running = sorted(r.id for r in world.snapshot.running)
    if not running:
        return
    ids = data.draw(st.lists(st.sampled_from(running), unique=True, min_size=1))
    at_once, one_by_one = CycleState(world.snapshot), CycleState(world.snapshot)
    clock = at_once.table.clock
    at_once.remove_many(ids)
    for job_id in ids:
        one_by_one.remove(job_id)
    assert _full_fingerprint(at_once) == _full_fingerprint(one_by_one)
    touched = sorted({at_once.table.index[w.node] for j in ids for w in at_once.holdings[j].workers})
    assert (at_once.table.version[touched] > clock).all()
    back = data.draw(st.lists(st.sampled_from(ids), unique=True))
    at_once.restore_many(back)
    for job_id in back:
        one_by_one.restore(job_id)
    assert _full_fingerprint(at_once) == _full_fingerprint(one_by_one)
