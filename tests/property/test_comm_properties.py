"""The communication gate on random worlds: jobs declaring `comm` keep every invariant of the cycle (gangs all or
nothing, no GPU given twice, quotas, a refused placement leaving the table exactly as it was), no placement of
such a job passes its limit, and the result does not depend on the order of the pending list."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import Job
from gpufleet.domain.comm import CommNeeds
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.comm_gate import placement_estimate
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.table import NodeInfo
from tests.kit import check_all
from tests.property.strategies import World, worlds

needs = st.builds(
    CommNeeds,
    st.sampled_from((700_000_000, 2_600_000_000, 14_000_000_000, 26_000_000_000)),
    st.sampled_from((0.25, 1.0, 2.0)),
    st.sampled_from((None, 0.05, 0.2, 0.5)),
)


@st.composite
def comm_worlds(draw: st.DrawFn) -> World:
    world = draw(worlds(max_pending=10))
    pending = tuple(
        dataclasses.replace(job, comm=draw(needs)) if not job.request.fractional and draw(st.booleans()) else job
        for job in world.pending
    )
    return dataclasses.replace(world, pending=pending)


@given(comm_worlds())
def test_declaring_jobs_keep_the_invariants_and_their_limits(world: World) -> None:
    policy = profile(world.profile_name)
    result = run_cycle(world.snapshot, world.pending, policy)
    check_all(world.snapshot, world.pending, result, policy)
    table = NodeInfo(world.snapshot.nodes)
    by_id: dict[str, Job] = {j.id: j for j in world.pending}
    for placement in result.placements:
        job = by_id[placement.job]
        if job.comm is not None and job.comm.max_overhead is not None:
            # Elastic workers added beyond the gang's minimum are not gated: judge the gang that was.
            gang = placement.workers[: job.gang_size]
            assert placement_estimate(job.comm, table, gang).overhead <= job.comm.max_overhead


@given(comm_worlds(), st.randoms(use_true_random=False))
def test_same_input_same_bytes_in_any_order(world: World, rnd: random.Random) -> None:
    policy = profile(world.profile_name)
    first = run_cycle(world.snapshot, world.pending, policy).to_json()
    shuffled = list(world.pending)
    rnd.shuffle(shuffled)
    assert run_cycle(world.snapshot, tuple(shuffled), policy).to_json() == first
