"""Reservations (EASY backfill) on random worlds: the cycle's invariants still hold, and a job given a reserved
start starts no later than it when every job ends within its run time limit."""

from __future__ import annotations

import dataclasses
import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import ClusterSnapshot, Job, RunningJob, WorkerRequest
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.cycle import run_cycle
from tests.kit import check_all, cluster
from tests.property.strategies import PROFILE_NAMES, World, worlds

# Profiles that stop no running job: with preemption a reserved job may also be overtaken by higher priority.
NON_PREEMPTING = tuple(
    name for name in PROFILE_NAMES if profile(name).preempt is None and profile(name).round_s is None
)


@given(worlds(), st.data())
def test_every_result_keeps_the_invariants_with_reservations(world: World, data: st.DataObject) -> None:
    """Capacity, quota, gang and victim invariants with every waiting job past the threshold and jobs of random
    (or no) run time limits."""
    seconds = st.one_of(st.none(), st.integers(1, 5_000).map(float))
    running = tuple(
        dataclasses.replace(r, job=dataclasses.replace(r.job, expected_duration=data.draw(seconds)))
        for r in world.snapshot.running
    )
    snapshot = dataclasses.replace(world.snapshot, running=running)
    pending = [dataclasses.replace(j, expected_duration=data.draw(seconds)) for j in world.pending]
    policy = dataclasses.replace(profile(world.profile_name), reserve_after_s=0.0)
    result = run_cycle(snapshot, pending, policy)
    check_all(snapshot, pending, result, policy)
    assert len(result.reserved_starts) <= 1
    for reservation in result.reserved_starts:
        assert reservation.job in result.waiting
        assert reservation.job not in {p.job for p in result.placements}
    assert result.to_json() == run_cycle(snapshot, list(reversed(pending)), policy).to_json()


@st.composite
def streams(draw: st.DrawFn) -> tuple[tuple[int, ...], list[tuple[float, float, Job]], list[tuple[float, float, Job]]]:
    """Node sizes; jobs running at t=0 (end, limit, job); jobs arriving later (arrival, run time, job). Every job
    runs at most its limit (`expected_duration`)."""
    sizes = tuple(draw(st.lists(st.sampled_from((2, 4, 8)), min_size=1, max_size=3)))
    limit = st.integers(10, 400).map(float)
    running = []
    for index in range(draw(st.integers(0, sum(sizes)))):
        seconds = draw(limit)
        ran = draw(st.floats(0.1, 1.0)) * seconds
        job = Job(f"r{index:02d}", "default", WorkerRequest(gpus=1), expected_duration=seconds, submit_seq=index)
        running.append((ran, seconds, job))
    arrivals = []
    for index in range(draw(st.integers(0, 25))):
        seconds = draw(limit)
        at = float(draw(st.integers(0, 600)))
        gpus = draw(st.sampled_from((1, 1, 1, 2)))
        job = Job(
            f"s{index:02d}", "default", WorkerRequest(gpus=gpus), expected_duration=seconds, submit_seq=100 + index,
            submitted_at=at,
        )  # fmt: skip
        arrivals.append((at, draw(st.floats(0.1, 1.0)) * seconds, job))
    return sizes, running, arrivals


@settings(max_examples=150, deadline=None)
@given(streams(), st.sampled_from(NON_PREEMPTING))
def test_a_reserved_job_starts_no_later_than_its_reserved_start(
    stream: tuple[tuple[int, ...], list[tuple[float, float, Job]], list[tuple[float, float, Job]]], name: str
) -> None:
    """A gang as large as the largest node waits from long ago; running jobs and a stream of arrivals end within
    their limits. Event by event, as the control loop decides: the gang starts by the first start reserved for it."""
    sizes, at_start, arrivals = stream
    builder = cluster()
    for index, size in enumerate(sizes):
        builder = builder.nodes(1, "A100-80GB", gpus=size, prefix=f"n{index}-")
    nodes = builder.build()
    policy = dataclasses.replace(profile(name), reserve_after_s=60.0)
    gang = Job("gang", "default", WorkerRequest(gpus=max(sizes)), expected_duration=100.0, submitted_at=-1_000.0)

    # Place the jobs running at t=0 as a cycle would, then give them their run times.
    first = run_cycle(ClusterSnapshot(nodes), [job for _, _, job in at_start], profile("first-fit"))
    by_id = {job.id: (ran, job) for ran, _, job in at_start}
    running = {p.job: RunningJob(by_id[p.job][1], p.workers, 0.0) for p in first.placements}
    ends = [(by_id[job_id][0], job_id) for job_id in running]
    heapq.heapify(ends)
    runs = {job.id: ran for _, ran, job in arrivals}
    incoming = sorted(((at, job.id, job) for at, _, job in arrivals), reverse=True)
    pending: dict[str, Job] = {"gang": gang}
    reserved_by: float | None = None
    now = 0.0
    for _ in range(200):
        while ends and ends[0][0] <= now:
            running.pop(heapq.heappop(ends)[1], None)
        while incoming and incoming[-1][0] <= now:
            _, job_id, job = incoming.pop()
            pending[job_id] = job
        snapshot = ClusterSnapshot(nodes, tuple(running.values()), now=now)
        result = run_cycle(snapshot, sorted(pending.values(), key=lambda j: j.id), policy)
        check_all(snapshot, list(pending.values()), result, policy)
        for reservation in result.reserved_starts:
            if reservation.job == "gang" and reservation.start_by is not None and reserved_by is None:
                reserved_by = reservation.start_by
        for placement in result.placements:
            job = pending.pop(placement.job)
            running[job.id] = RunningJob(job, placement.workers, now)
            heapq.heappush(ends, (now + runs.get(job.id, 100.0), job.id))
        if "gang" in running:
            break
        upcoming = [t for t in (ends[0][0] if ends else None, incoming[-1][0] if incoming else None) if t is not None]
        if not upcoming:
            break
        now = max(now, min(upcoming))
    assert "gang" in running, "the gang never started"
    if reserved_by is not None:
        assert now <= reserved_by + 1e-9, f"reserved to start by {reserved_by}, started at {now}"
