"""Preemption (`preempt/priority`): who may be a victim, the fewest and cheapest victims, and never
a preemption that does not make room."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpufleet.domain import ClusterSnapshot, Job, RunningJob
from gpufleet.domain.errors import SpecError
from gpufleet.policies.catalog import profile
from gpufleet.policies.preempt.las import LasPreemption
from gpufleet.policies.preempt.priority import PriorityPreemption
from gpufleet.scheduling.cycle import CycleResult, _WhatIf
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.status import Code, unschedulable
from tests.kit import (
    QueueBuilder,
    advance,
    cluster,
    fingerprint,
    make_job,
    nodes_of,
    queue,
    run,
    running_on,
    victims,
    view_of,
    without,
)
from tests.kit.reasons import NO_VICTIM

NOW = 1000.0
TWO = cluster().nodes(2, "A100-80GB", gpus=8)
N0, N1 = TWO.build()


def on(
    job: Job,
    node_gpus: Sequence[tuple[int, Sequence[int]]],
    *,
    started_at: float = 0.0,
    last_checkpoint_at: float | None = None,
    evicting_for: str | None = None,
) -> RunningJob:
    """`job` running with one worker per `(node index, gpu indices)` on the two-node cluster."""
    nodes = (N0, N1)
    return running_on(
        job,
        [(nodes[n], gpus) for n, gpus in node_gpus],
        started_at=started_at,
        last_checkpoint_at=last_checkpoint_at,
        evicting_for=evicting_for,
    )


def low(job_id: str, gpus: int = 8, priority: int = 0) -> Job:
    return make_job(job_id).gpus(gpus).priority(priority).build()


def snapshot(*running: RunningJob, queues: Sequence[QueueBuilder] = ()) -> ClusterSnapshot:
    return TWO.snapshot(running=running, queues=queues, now=NOW)


def decide(snap: ClusterSnapshot, *jobs: Job, profile_name: str = "priority") -> CycleResult:
    return run(snap, list(jobs), profile(profile_name))


HIGH8 = make_job("high").gpus(8).priority(5).build()
HIGH4 = make_job("high").gpus(4).priority(5).build()


@pytest.mark.parametrize("profile_name", ["priority", "default"])
def test_a_higher_priority_job_preempts_a_lower_one(profile_name: str) -> None:
    snap = snapshot(on(low("a"), [(0, range(8))]), on(low("b", priority=7), [(1, range(8))]))
    result = decide(snap, HIGH8, profile_name=profile_name)
    assert victims(result) == {"a": "high"}
    assert result.preemptions[0].reason == "lower priority (0 < 5) in queue default"
    assert result.waiting["high"].code is Code.WAIT
    assert result.waiting["high"].reasons == ("preempting 1 job(s) to make room: a",)
    assert result.waiting["high"].plugin == "priority"


@pytest.mark.parametrize(
    ("running_priority", "preemptible"),
    [
        pytest.param(5, True, id="equal-priority"),
        pytest.param(6, True, id="higher-priority"),
        pytest.param(0, False, id="non-preemptible"),
    ],
)
def test_no_victim_that_may_not_be_preempted(running_priority: int, preemptible: bool) -> None:
    job = make_job("r").gpus(8).priority(running_priority).preemptible(preemptible).build()
    snap = snapshot(on(job, [(0, range(8))]), on(make_job("r2").gpus(8).priority(9).build(), [(1, range(8))]))
    result = decide(snap, HIGH8)
    assert not result.preemptions
    assert result.waiting["high"].code is Code.UNSCHEDULABLE
    assert result.waiting["high"].reasons == ("0/2 nodes fit: 2 too few free GPUs", NO_VICTIM)


@pytest.mark.parametrize("profile_name", ["fifo", "fifo-backfill", "spread", "best-fit", "las"])
def test_profiles_without_preemption_never_preempt(profile_name: str) -> None:
    snap = snapshot(on(low("a"), [(0, range(8))]), on(low("b"), [(1, range(8))]))
    result = decide(snap, HIGH8, profile_name=profile_name)
    assert not result.preemptions
    assert result.waiting["high"].reasons == ("0/2 nodes fit: 2 too few free GPUs",)


def test_never_evicts_when_the_job_still_would_not_fit() -> None:
    # Half of each node is held by a job that may not be preempted: evicting the rest gives 4 + 4, not 8.
    snap = snapshot(
        on(low("a", 4), [(0, range(4))]),
        on(make_job("keep0").gpus(4).non_preemptible().build(), [(0, range(4, 8))]),
        on(low("b", 4), [(1, range(4))]),
        on(make_job("keep1").gpus(4).priority(9).build(), [(1, range(4, 8))]),
    )
    result = decide(snap, HIGH8)
    assert not result.preemptions
    assert result.waiting["high"].reasons == (
        "0/2 nodes fit: 2 too few free GPUs",
        "preempting all 2 eligible jobs would not make room",
    )


def test_the_fewest_victims_on_one_node() -> None:
    # node-00: two 4-GPU jobs; node-01: four 2-GPU jobs. One victim on node-00 makes room.
    snap = snapshot(
        on(low("a1", 4), [(0, range(4))]),
        on(low("a2", 4), [(0, range(4, 8))]),
        *(on(low(f"b{i}", 2), [(1, (2 * i, 2 * i + 1))]) for i in range(4)),
    )
    result = decide(snap, HIGH4)
    assert victims(result) == {"a1": "high"}


def test_victims_come_from_one_node_not_scattered() -> None:
    # 2 GPUs free on each node, 2-GPU jobs elsewhere: a 4-GPU job needs one victim on either node.
    snap = snapshot(
        on(low("a1", 2), [(0, (0, 1))]),
        on(low("a2", 2), [(0, (2, 3))]),
        on(make_job("a3").gpus(2).priority(9).build(), [(0, (4, 5))]),
        on(low("b1", 2), [(1, (0, 1))]),
        on(make_job("b2").gpus(4).priority(9).build(), [(1, (2, 3, 4, 5))]),
    )
    result = decide(snap, HIGH4)
    assert len(result.preemptions) == 1


@pytest.mark.parametrize(
    ("x_checkpoint", "y_checkpoint", "victim"),
    [
        pytest.param(900.0, None, "x", id="x-loses-100s-y-loses-1000s"),
        pytest.param(None, 900.0, "y", id="y-loses-100s-x-loses-1000s"),
        pytest.param(500.0, 600.0, "y", id="y-checkpointed-later"),
        pytest.param(None, None, "x", id="tie-by-node-name"),
    ],
)
def test_prefers_the_least_work_lost_since_the_last_checkpoint(
    x_checkpoint: float | None, y_checkpoint: float | None, victim: str
) -> None:
    snap = snapshot(
        on(low("x"), [(0, range(8))], last_checkpoint_at=x_checkpoint),
        on(low("y"), [(1, range(8))], last_checkpoint_at=y_checkpoint),
    )
    assert victims(decide(snap, HIGH8)) == {victim: "high"}


def test_prefers_the_lowest_priority_victim_over_less_lost_work() -> None:
    snap = snapshot(
        on(low("x", priority=1), [(0, range(8))], last_checkpoint_at=999.0),
        on(low("y", priority=0), [(1, range(8))]),
    )
    assert victims(decide(snap, HIGH8)) == {"y": "high"}


def test_the_cheapest_victim_set_wins_even_on_a_node_ranked_later() -> None:
    """Nodes are searched in order of what all their candidates would lose (node 1 first: 500 s,
    against 1001 s on node 0), but the choice is the cheapest set that makes room: x alone on
    node 0, losing 1 s. A node whose cheapest candidate cannot beat the best set is skipped; this
    one can, so it is searched."""
    snap = snapshot(
        on(low("x", gpus=4), [(0, range(4))], last_checkpoint_at=999.0),
        on(low("z", gpus=4), [(0, range(4, 8))]),
        on(low("y"), [(1, range(8))], last_checkpoint_at=500.0),
    )
    assert victims(decide(snap, HIGH4)) == {"x": "high"}


def test_a_gang_preempts_the_cheapest_set_on_several_nodes() -> None:
    snap = snapshot(
        on(low("x", 8, priority=2), [(0, range(8))]),
        on(low("y", 4, priority=0), [(1, range(4))]),
        on(low("z", 4, priority=1), [(1, range(4, 8))]),
    )
    gang = make_job("g").gpus(4).workers(2).priority(5).build()
    result = decide(snap, gang)
    assert victims(result) == {"y": "g", "z": "g"}


def test_preempting_for_a_gang_never_takes_more_than_needed() -> None:
    # The cheapest candidates come first, but a gang of 2 x 8 needs whole nodes: y and z are enough,
    # and the small cheap job on node-00's side is reprieved.
    three = cluster().nodes(3, "A100-80GB")
    n0, n1, n2 = three.build()
    snap = three.snapshot(
        running=[
            running_on(make_job("cheap").gpus(2).build(), [(n0, (0, 1))]),
            running_on(make_job("keep").gpus(6).priority(9).build(), [(n0, range(2, 8))]),
            running_on(make_job("y").gpus(8).priority(1).build(), [(n1, range(8))]),
            running_on(make_job("z").gpus(8).priority(1).build(), [(n2, range(8))]),
        ],
        now=NOW,
    )
    result = run(snap, [make_job("g").gpus(8).workers(2).priority(5).build()], profile("priority"))
    assert victims(result) == {"y": "g", "z": "g"}


# ---- queues: guarantee and reclaim -----------------------------------------------------------------

COHORT = [queue("team-a").gpus(8).cohort("c"), queue("team-b").gpus(8).cohort("c")]


def test_reclaims_borrowed_quota_from_another_queue_of_the_cohort() -> None:
    b1 = make_job("b1").gpus(8).queue("team-b").priority(3).build()
    b2 = make_job("b2").gpus(8).queue("team-b").priority(3).build()
    snap = snapshot(on(b1, [(0, range(8))]), on(b2, [(1, range(8))], started_at=500.0), queues=COHORT)
    result = decide(snap, make_job("a").gpus(8).queue("team-a").priority(0).build(), profile_name="default")
    # Reclaim ignores priority; the victim is the one that loses the least work (b2 started later).
    assert victims(result) == {"b2": "a"}
    assert result.preemptions[0].reason == "queue team-b borrows above its nominal quota; queue team-a reclaims it"


def test_no_reclaim_beyond_the_reclaiming_queues_own_nominal() -> None:
    b1 = make_job("b1").gpus(8).queue("team-b").build()
    b2 = make_job("b2").gpus(8).queue("team-b").build()
    a0 = make_job("a0").gpus(4).queue("team-a").build()
    three = cluster().nodes(3, "A100-80GB")
    n0, n1, n2 = three.build()
    snap = three.snapshot(
        running=[running_on(b1, [(n0, range(8))]), running_on(b2, [(n1, range(8))]), running_on(a0, [(n2, range(4))])],
        queues=COHORT,
        now=NOW,
    )
    # team-a runs 4 of its 8: asking 8 more would take it above nominal, so it may not reclaim.
    result = run(snap, [make_job("a").gpus(8).queue("team-a").build()], profile("default"))
    assert not result.preemptions
    assert result.waiting["a"].code is Code.UNSCHEDULABLE


def test_a_queue_within_its_nominal_quota_is_protected_from_other_queues() -> None:
    one = cluster().nodes(1, "A100-80GB")
    (n0,) = one.build()
    b = make_job("b").gpus(8).queue("team-b").priority(0).build()
    snap = one.snapshot(running=[running_on(b, [(n0, range(8))])], queues=COHORT, now=NOW)
    result = run(snap, [make_job("a").gpus(8).queue("team-a").priority(9).build()], profile("default"))
    assert not result.preemptions
    assert result.waiting["a"].reasons[-1] == NO_VICTIM


def test_quota_held_for_a_preemptor_does_not_make_its_queue_borrow() -> None:
    # team-a runs 17 of its 17 cores. `a` (team-a) preempts `big` (16 cores, same queue) for the quota
    # room; the 0.5 core held for it must not make team-a look as if it borrowed, or team-b would
    # "reclaim" a GPU from team-a, which uses no more than its nominal quota.
    one = cluster().nodes(1, "A100-80GB", gpus=2, cpu=32)
    (n0,) = one.build()
    team_a = [
        make_job("big").queue("team-a").cpu_only().cpu(16).build(),
        make_job("s1").queue("team-a").cpu_only().cpu(0.5).build(),
        make_job("s2").queue("team-a").cpu_only().cpu(0.5).build(),
        make_job("g1").queue("team-a").gpus(1).build(),
        make_job("g2").queue("team-a").gpus(1).build(),
    ]
    snap = one.snapshot(
        running=[running_on(job, [(n0, [i - 3] if job.request.gpus else [])]) for i, job in enumerate(team_a)],
        queues=[queue("team-a").cpu(17).cohort("c"), queue("team-b").cohort("c")],
        now=NOW,
    )
    pending = [
        make_job("a").queue("team-a").cpu_only().cpu(0.5).priority(1).seq(0).build(),
        make_job("b").queue("team-b").gpus(1).priority(0).seq(1).build(),
    ]
    result = run(snap, pending, profile("priority"))
    assert victims(result) == {"big": "a"}
    assert result.waiting["b"].reasons[-1] == NO_VICTIM


def test_each_preemptor_of_a_cohort_stops_only_what_it_needs() -> None:
    # team-b borrows all 16 GPUs of the cohort. Two 1-GPU jobs of team-a reclaim one GPU each: the quota
    # held for the first counts once (its victim's GPU is on its way back), so the second does not stop a
    # second job to pay for the first one's quota as well.
    b_jobs = [make_job(f"b{i:02d}").gpus(1).queue("team-b").build() for i in range(16)]
    snap = snapshot(*(on(b, [(i // 8, [i % 8])], started_at=float(i)) for i, b in enumerate(b_jobs)), queues=COHORT)
    pending = [make_job(f"a{i}").gpus(1).queue("team-a").seq(i).build() for i in range(2)]
    result = run(snap, pending, profile("default"))
    stopped_for = victims(result)
    assert sorted(stopped_for.values()) == ["a0", "a1"]
    assert len(stopped_for) == 2


def test_lower_priority_in_a_queue_without_guarantee() -> None:
    one = cluster().nodes(1, "A100-80GB")
    (n0,) = one.build()
    x = make_job("x").gpus(8).queue("team-x").priority(0).build()
    snap = one.snapshot(running=[running_on(x, [(n0, range(8))])], queues=[queue("team-x"), queue("team-y")], now=NOW)
    result = run(snap, [make_job("y").gpus(8).queue("team-y").priority(1).build()], profile("priority"))
    assert victims(result) == {"x": "y"}
    assert result.preemptions[0].reason == "lower priority (0 < 1) in queue team-x, which has no guarantee"


def test_same_queue_lower_priority_is_preempted_even_within_nominal() -> None:
    one = cluster().nodes(1, "A100-80GB")
    (n0,) = one.build()
    x = make_job("x").gpus(8).queue("team-a").priority(0).build()
    snap = one.snapshot(running=[running_on(x, [(n0, range(8))])], queues=COHORT, now=NOW)
    result = run(snap, [make_job("y").gpus(8).queue("team-a").priority(1).build()], profile("default"))
    assert victims(result) == {"x": "y"}


# ---- victims that are already stopping ---------------------------------------------------------------


def test_a_job_with_outstanding_victims_waits_instead_of_preempting_more() -> None:
    snap = snapshot(
        on(low("a", 4), [(0, range(4))], evicting_for="high"),
        on(low("a2", 4), [(0, range(4, 8))]),
        on(low("b"), [(1, range(8))]),
    )
    result = decide(snap, HIGH8)
    assert not result.preemptions
    assert result.waiting["high"].code is Code.WAIT
    assert result.waiting["high"].reasons == (
        "waiting for 1 preempted job(s) to stop: a",
        "0/2 nodes fit: 2 too few free GPUs",
    )


def test_a_job_with_outstanding_victims_starts_once_it_fits() -> None:
    snap = snapshot(on(low("a", 4), [(0, range(4))], evicting_for="high"))
    result = decide(snap, HIGH4)
    assert [p.job for p in result.placements] == ["high"]


def test_a_victim_already_evicting_is_not_chosen_again() -> None:
    snap = snapshot(
        on(low("a"), [(0, range(8))], evicting_for="someone-else"),
        on(low("b"), [(1, range(8))]),
    )
    h1 = make_job("h1").gpus(8).priority(5).seq(1).build()
    h2 = make_job("h2").gpus(8).priority(5).seq(2).build()
    result = decide(snap, h1, h2)
    assert victims(result) == {"b": "h1"}
    assert result.waiting["h2"].reasons == ("0/2 nodes fit: 2 too few free GPUs", NO_VICTIM)


def test_preemption_over_cycles_victims_stop_then_the_job_starts() -> None:
    snap = snapshot(on(low("a"), [(0, range(8))]), on(low("b"), [(1, range(8))]))
    policy = profile("priority")
    first = run(snap, [HIGH8], policy)
    assert victims(first) == {"a": "high"}
    evicting = advance(snap, first, [HIGH8], now=NOW + 10)
    second = run(evicting, [HIGH8], policy)  # the victim is still in its grace period
    assert not second.preemptions
    assert second.waiting["high"].code is Code.WAIT
    stopped = without(evicting, ["a"])
    third = run(stopped, [HIGH8], policy)
    assert nodes_of(third, "high") == ["node-00"]


def test_a_nominated_job_goes_first_in_the_next_cycle() -> None:
    # `high` preempted `a` last cycle; now `a` has stopped and `rival` (higher priority, earlier) pends too.
    snap = snapshot(on(low("a"), [(0, range(8))]), on(low("b", priority=9), [(1, range(8))]))
    first = decide(snap, HIGH8)
    nominated = without(advance(snap, first, [HIGH8]), ["a"])
    assert nominated.nominated == ("high",)
    rival = make_job("rival").gpus(8).priority(7).submitted(-1).build()
    result = decide(nominated, rival, HIGH8)
    assert [p.job for p in result.placements] == ["high"]
    assert not result.preemptions


# ---- the what-if view ------------------------------------------------------------------------------


def test_the_what_if_view_is_restored_exactly() -> None:
    snap = snapshot(
        on(low("a1", 4), [(0, range(4))]),
        on(low("a2", 4), [(0, range(4, 8))]),
        on(low("b", 2), [(1, (0, 1))]),
        on(make_job("keep").gpus(6).non_preemptible().build(), [(1, range(2, 8))]),
    )
    policy = profile("priority")
    state = CycleState(snap)
    before = fingerprint(state)
    for job in (HIGH4, HIGH8, make_job("g").gpus(4).workers(2).priority(5).build()):
        blocked = unschedulable("test", f"{job.id} does not fit")
        choice = PriorityPreemption().preempt(view_of(job, state), state.view, blocked, _WhatIf(policy, state))
        assert choice.victims
        assert fingerprint(state) == before
        assert not state.removed


# ---- a known gap -----------------------------------------------------------------------------------


def test_the_room_a_preemptor_counts_on_is_kept_for_it() -> None:
    # node-00: 4 GPUs free + a low job on 4; node-01 is held by a high job. `high` (8 GPUs) preempts
    # the low job, then `small` (2 GPUs, decided after it) takes 2 of the 4 free GPUs.
    snap = snapshot(
        on(low("a", 4), [(0, range(4))]),
        on(make_job("keep").gpus(8).priority(9).build(), [(1, range(8))]),
    )
    small = make_job("small").gpus(2).priority(0).non_preemptible().build()
    result = decide(snap, HIGH8, small)
    assert victims(result) == {"a": "high"}
    # Once the victim has stopped, with everything decided in that cycle running, `high` must fit.
    later = without(advance(snap, result, [HIGH8, small]), ["a"])
    assert [p.job for p in run(later, [HIGH8], profile("priority")).placements] == ["high"]


# ---- LAS preemption (`preempt/las`, part of `default`) ----------------------------------------------------

HOUR = 3_600.0


def las_snapshot(*running: RunningJob, now: float) -> ClusterSnapshot:
    return TWO.snapshot(running=running, now=now)


def test_a_new_job_suspends_the_job_of_its_queue_with_hours_of_gpu_time() -> None:
    # Both nodes busy with 8-GPU jobs of the same queue and priority: one has had 8 x 2 h, the other 8 x 6 min.
    long_run = on(low("long"), [(0, range(8))], started_at=0.0)
    short_run = on(low("short"), [(1, range(8))], started_at=2 * HOUR - 360.0)
    result = decide(las_snapshot(long_run, short_run, now=2 * HOUR), low("new"), profile_name="default")
    assert victims(result) == {"long": "new"}
    assert result.preemptions[0].reason == "attained more service (LAS band 2 > 0)"


def test_las_never_suspends_a_job_for_one_with_as_much_service() -> None:
    long_run = on(low("long"), [(0, range(8))], started_at=0.0)
    other = on(low("other"), [(1, range(8))], started_at=0.0)
    served = make_job("served").gpus(8).attained(11 * HOUR * 8).build()  # band 2 already, as both runners
    result = decide(las_snapshot(long_run, other, now=2 * HOUR), served, profile_name="default")
    assert not result.preemptions


@pytest.mark.parametrize(("ran_s", "stopped"), [(899.0, False), (900.0, True)])
def test_default_lets_a_restarted_job_run_15_minutes_before_las_stops_it(ran_s: float, stopped: bool) -> None:
    # Attained 2 h before this run: band 2 from its first second; the minimum run protects its restart.
    restarted = make_job("restarted").gpus(8).attained(2 * HOUR * 8).build()
    busy = on(low("busy", priority=9), [(1, range(8))], started_at=0.0)
    snap = las_snapshot(on(restarted, [(0, range(8))], started_at=10 * HOUR - ran_s), busy, now=10 * HOUR)
    result = decide(snap, low("new"), profile_name="default")
    assert bool(result.preemptions) is stopped


def test_las_takes_no_victims_from_other_queues_or_higher_priorities() -> None:
    other_queue = on(make_job("theirs").gpus(8).queue("team-b").build(), [(0, range(8))], started_at=0.0)
    higher = on(low("higher", priority=3), [(1, range(8))], started_at=0.0)
    queues = (queue("default"), queue("team-b"))
    snap = TWO.snapshot(running=(other_queue, higher), queues=queues, now=5 * HOUR)
    result = decide(snap, low("new"), profile_name="default")
    assert not result.preemptions


def test_las_preemption_checks_its_minimum_run() -> None:
    with pytest.raises(SpecError, match="min_run_s"):
        LasPreemption(min_run_s=-1.0)
