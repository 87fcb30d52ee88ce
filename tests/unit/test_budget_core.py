"""A queue whose budget is spent with the action `deprioritise` reaches the core as data
(`QueueSpec.deprioritised`): it does not borrow, its jobs are the first victims, and it preempts nobody."""

from __future__ import annotations

from gpufleet.scheduling.status import Code
from tests.kit import make_job, queue, victims
from tests.unit.test_preempt import decide, on, snapshot


def test_a_deprioritised_queue_does_not_borrow_from_its_cohort() -> None:
    held = make_job("a0").gpus(8).queue("team-a").build()
    more = make_job("a1").gpus(8).queue("team-a").build()
    open_ = [queue("team-a").gpus(8).cohort("c"), queue("team-b").gpus(8).cohort("c")]
    placed = decide(snapshot(on(held, [(0, range(8))]), queues=open_), more, profile_name="default")
    assert [p.job for p in placed.placements] == ["a1"]  # borrows team-b's idle quota
    spent = [queue("team-a").gpus(8).cohort("c").deprioritised(), queue("team-b").gpus(8).cohort("c")]
    result = decide(snapshot(on(held, [(0, range(8))]), queues=spent), more, profile_name="default")
    assert result.placements == ()
    assert result.waiting["a1"].code is Code.UNSCHEDULABLE
    assert any("its budget is spent, so it does not borrow" in r for r in result.waiting["a1"].reasons)


def test_jobs_of_a_deprioritised_queue_are_the_first_victims_whatever_their_priority() -> None:
    rich = make_job("a9").gpus(8).queue("team-a").priority(9).build()
    low = make_job("b0").gpus(8).queue("team-b").priority(0).build()
    high = make_job("b5").gpus(8).queue("team-b").priority(5).build()
    running = (on(rich, [(0, range(8))]), on(low, [(1, range(8))]))
    normal = decide(snapshot(*running, queues=[queue("team-a"), queue("team-b")]), high, profile_name="default")
    assert victims(normal) == {"b0": "b5"}
    spent = [queue("team-a").deprioritised(), queue("team-b")]
    result = decide(snapshot(*running, queues=spent), high, profile_name="default")
    assert victims(result) == {"a9": "b5"}
    assert result.preemptions[0].reason == "queue team-a spent its budget: its jobs run only on idle capacity"


def test_a_deprioritised_queue_preempts_nobody() -> None:
    low = make_job("a0").gpus(8).queue("team-a").priority(0).build()
    other = make_job("b0").gpus(8).queue("team-b").priority(0).build()
    high = make_job("a9").gpus(8).queue("team-a").priority(9).build()
    running = (on(low, [(0, range(8))]), on(other, [(1, range(8))]))
    normal = decide(snapshot(*running, queues=[queue("team-a"), queue("team-b")]), high, profile_name="default")
    assert victims(normal) == {"a0": "a9"}
    spent = [queue("team-a").deprioritised(), queue("team-b")]
    result = decide(snapshot(*running, queues=spent), high, profile_name="default")
    assert result.preemptions == ()
    assert any("run only on idle capacity and preempt none" in r for r in result.waiting["a9"].reasons)
