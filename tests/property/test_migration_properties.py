"""The cycle's migration hook (`Profile.migrate`) on random worlds: whatever running jobs a policy names, the
result keeps every invariant (no GPU given twice, no job both moved and preempted or placed), and exactly the
named jobs that can move are moved, once."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import JobId
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.plugin_api import ClusterView
from tests.kit import advance, check_all, still_pending, without
from tests.property.strategies import World, worlds


class NamedMoves:
    """Moves the jobs it is given (any ids: running, stopping, pending or unknown), in the order given."""

    name: ClassVar[str] = "named"

    def __init__(self, job_ids: Sequence[JobId]) -> None:
        self.job_ids = list(job_ids)

    def migrations(self, cluster: ClusterView) -> list[tuple[JobId, str]]:
        return [(job_id, "named by the test") for job_id in self.job_ids]


def _named(world: World, data: st.DataObject) -> list[JobId]:
    ids = sorted({r.id for r in world.snapshot.running} | {j.id for j in world.pending} | {"no-such-job"})
    return data.draw(st.lists(st.sampled_from(ids), max_size=8))


@given(worlds(), st.data())
def test_moves_keep_the_invariants_and_move_exactly_the_movable_jobs(world: World, data: st.DataObject) -> None:
    named = _named(world, data)
    policy = dataclasses.replace(profile(world.profile_name), migrate=NamedMoves(named))
    result = run_cycle(world.snapshot, world.pending, policy)
    check_all(world.snapshot, world.pending, result, policy)
    running = {r.id: r for r in world.snapshot.running}
    victims = {p.victim for p in result.preemptions}
    movable = {j for j in named if j in running and not running[j].evicting and j not in victims}
    assert sorted(m.job for m in result.migrations) == sorted(movable)
    # The same input gives the same bytes; without a plugin (or with nothing to move) the result is the one
    # the profile gives on its own.
    assert run_cycle(world.snapshot, world.pending, policy).to_json() == result.to_json()
    if not movable:
        assert result.to_json() == run_cycle(world.snapshot, world.pending, profile(world.profile_name)).to_json()


@given(worlds(max_pending=10), st.integers(2, 4), st.data())
def test_moves_keep_the_invariants_over_several_cycles(world: World, cycles: int, data: st.DataObject) -> None:
    """Moved jobs stop like victims (some now, some later): every next cycle still keeps the invariants."""
    snapshot, pending = world.snapshot, list(world.pending)
    for _ in range(cycles):
        policy = dataclasses.replace(profile(world.profile_name), migrate=NamedMoves(_named(world, data)))
        result = run_cycle(snapshot, pending, policy)
        check_all(snapshot, pending, result, policy)
        snapshot = advance(snapshot, result, pending, now=snapshot.now + 60.0)
        pending = still_pending(pending, result)
        evicting = sorted(r.id for r in snapshot.running if r.evicting)
        stopped = data.draw(st.lists(st.sampled_from(evicting), unique=True) if evicting else st.just([]))
        snapshot = without(snapshot, stopped)
