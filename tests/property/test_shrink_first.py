"""`default`'s preemption (`ShrinkFirstLas`) on random worlds under pressure: a resizable elastic job is never
stopped for attained service (it shrinks instead), and where no running job is resizable every decision is
LAS's own, byte for byte."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import ClusterSnapshot, Job
from gpufleet.policies.catalog import DEFAULT_LAS_MIN_RUN_S, profile
from gpufleet.policies.preempt.las import LasPreemption
from gpufleet.policies.resize.shrink_first import ShrinkFirstLas
from gpufleet.scheduling.cycle import run_cycle
from tests.kit import check_all, cluster, make_job, running_on
from tests.property.strategies import World, worlds

LAS_REASON = "attained more service"


def _contended(world: World, data: st.DataObject) -> tuple[ClusterSnapshot, list[Job]]:
    """Equal priorities, long-running jobs and fresh pending ones: LAS bands decide who may be stopped."""
    running = tuple(
        dataclasses.replace(
            r,
            started_at=float(data.draw(st.sampled_from((0, 0, 500, 950)))),
            job=dataclasses.replace(r.job, priority=0),
        )
        for r in world.snapshot.running
    )
    pending = [dataclasses.replace(j, priority=0, attained_gpu_seconds=0.0) for j in world.pending]
    return dataclasses.replace(world.snapshot, running=running), pending


@given(worlds(profile_names=("default",), max_pending=12, pressure=True), st.data())
def test_a_resizable_job_is_never_stopped_for_service(world: World, data: st.DataObject) -> None:
    snapshot, pending = _contended(world, data)
    policy = profile("default")
    assert isinstance(policy.preempt, ShrinkFirstLas)
    result = run_cycle(snapshot, pending, policy)
    check_all(snapshot, pending, result, policy)
    running = {r.job.id: r.job for r in snapshot.running}
    for stop in result.preemptions:
        if stop.victim in running and running[stop.victim].resizable:
            assert not stop.reason.startswith(LAS_REASON), stop


@given(worlds(profile_names=("default",), max_pending=12, pressure=True), st.data())
def test_without_resizable_running_jobs_it_decides_as_las(world: World, data: st.DataObject) -> None:
    snapshot, pending = _contended(world, data)
    fixed = tuple(
        dataclasses.replace(r, job=dataclasses.replace(r.job, min_workers=None)) if r.job.resizable else r
        for r in snapshot.running
    )
    snapshot = dataclasses.replace(snapshot, running=fixed)
    policy = profile("default")
    las = dataclasses.replace(policy, preempt=LasPreemption(min_run_s=DEFAULT_LAS_MIN_RUN_S))
    assert run_cycle(snapshot, pending, policy).to_json() == run_cycle(snapshot, pending, las).to_json()


HOUR = 3_600.0
TWO = cluster().nodes(2, "A100-80GB", gpus=8)
N0, N1 = TWO.build()


@pytest.mark.parametrize(("elastic", "stopped"), [(True, False), (False, True)])
def test_a_job_with_hours_of_service_is_stopped_for_a_newcomer_only_if_it_cannot_shrink(
    elastic: bool, stopped: bool
) -> None:
    # Both nodes busy with 8-GPU jobs of one queue; "long" has had 8 x 2 h. Fixed-size, LAS stops it for "new";
    # elastic (8 one-GPU workers, min 1), it is left to shrink and "new" waits.
    builder = make_job("long").gpus(1)
    long_job = (builder.elastic(1, 8) if elastic else builder.workers(8)).build()
    long_run = running_on(long_job, [(N0, [g]) for g in range(8)], started_at=0.0)
    short_run = running_on(make_job("short").gpus(8).build(), [(N1, range(8))], started_at=2 * HOUR - 360.0)
    snap = TWO.snapshot(running=(long_run, short_run), now=2 * HOUR)
    result = run_cycle(snap, [make_job("new").gpus(1).build()], profile("default"))
    assert bool(result.preemptions) is stopped
