"""Order plugins: the sort keys they give, and the order a cycle decides jobs in."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufleet.domain import Job
from gpufleet.policies.catalog import build_profile, profile
from gpufleet.policies.order.fair_share import FairShare, dominant_share
from gpufleet.policies.order.fifo import Fifo
from gpufleet.policies.order.las import LeastAttainedService
from gpufleet.policies.order.priority import Priority
from gpufleet.scheduling.plugin_api import OrderPlugin
from gpufleet.scheduling.state import CycleState
from tests.kit import cluster, make_job, queue, run, running_on


def decided_order(jobs: list[Job], profile_name: str, gpus: int = 64) -> list[str]:
    """The order placements were decided in, on a cluster large enough for every job."""
    snapshot = cluster().nodes(max(1, gpus // 8), "A100-80GB").snapshot()
    result = run(snapshot, jobs, profile(profile_name))
    assert not result.waiting
    return [p.job for p in result.placements]


EMPTY_STATE = CycleState(cluster().nodes(1, "A100-80GB").snapshot()).view


@pytest.mark.parametrize(
    ("plugin", "job", "key"),
    [
        pytest.param(Fifo(), make_job("j").submitted(5).priority(9).build(), (5.0,), id="fifo-ignores-priority"),
        pytest.param(Priority(), make_job("j").submitted(5).priority(9).build(), (-9, 5.0), id="priority"),
        pytest.param(FairShare(), make_job("j").submitted(5).priority(2).build(), (-2, 5.0), id="fair_share-in-queue"),
        pytest.param(LeastAttainedService(), make_job("j").attained(0).build(), (0, 0, 0.0), id="las-band-0"),
        pytest.param(LeastAttainedService(), make_job("j").attained(3599).build(), (0, 0, 0.0), id="las-band-0-edge"),
        pytest.param(LeastAttainedService(), make_job("j").attained(3600).build(), (1, 0, 0.0), id="las-band-1"),
        pytest.param(
            LeastAttainedService(), make_job("j").attained(36000).priority(1).build(), (2, -1, 0.0), id="las-band-2"
        ),
    ],
)
def test_job_keys(plugin: OrderPlugin, job: Job, key: tuple[object, ...]) -> None:
    assert plugin.job_key(job, EMPTY_STATE) == key


def test_las_thresholds_are_configurable_and_sorted() -> None:
    las = LeastAttainedService(thresholds=(100.0, 10.0))
    assert [las.band(make_job("j").attained(s).build()) for s in (0, 10, 99, 100, 1e9)] == [0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    ("profile_name", "expected"),
    [
        pytest.param("fifo-backfill", ["early-low", "mid-high", "late-high"], id="fifo-by-submission"),
        pytest.param("priority", ["mid-high", "late-high", "early-low"], id="priority-then-submission"),
        pytest.param("las", ["mid-high", "late-high", "early-low"], id="las-same-band-priority-then-fifo"),
    ],
)
def test_order_across_queues(profile_name: str, expected: list[str]) -> None:
    jobs = [
        make_job("late-high").queue("team-b").priority(5).submitted(30).build(),
        make_job("early-low").queue("team-a").priority(0).submitted(10).build(),
        make_job("mid-high").queue("team-c").priority(5).submitted(20).build(),
    ]
    assert decided_order(jobs, profile_name) == expected


def test_ties_break_by_submit_seq_then_id() -> None:
    jobs = [
        make_job("b").seq(1).build(),
        make_job("a").seq(1).build(),
        make_job("c").seq(0).build(),
    ]
    assert decided_order(jobs, "fifo-backfill") == ["c", "a", "b"]


def test_las_puts_less_served_bands_first_then_fifo_within_a_band() -> None:
    jobs = [
        make_job("served-long").attained(50_000).submitted(0).build(),
        make_job("served-some").attained(4_000).submitted(1).build(),
        make_job("new-late").attained(0).submitted(9).build(),
        make_job("new-early").attained(3_000).submitted(2).build(),
    ]
    assert decided_order(jobs, "las") == ["new-early", "new-late", "served-some", "served-long"]


# ---- fair share ---------------------------------------------------------------------------------


def test_dominant_share_is_the_largest_resource_share_over_weight() -> None:
    builder = cluster().nodes(2, "A100-80GB", gpus=8, cpu=100, memory=1000)
    n0, _ = builder.build()
    job = make_job("x").gpus(4).cpu(50).memory(100).queue("team-a").build()
    snapshot = builder.snapshot(
        running=[running_on(job, [(n0, range(4))])], queues=[queue("team-a").weight(2), queue("team-b")]
    )
    state = CycleState(snapshot)
    # GPU 4/16, CPU 50/200, memory 100/2000: dominant 0.25, over weight 2.
    assert dominant_share("team-a", state.view) == pytest.approx(0.125)
    assert dominant_share("team-b", state.view) == 0.0


def interleaving(weight_a: float, gpus: int) -> list[str]:
    snapshot = (
        cluster().nodes(1, "A100-80GB", gpus=gpus).snapshot(queues=[queue("team-a").weight(weight_a), queue("team-b")])
    )
    jobs = [make_job(f"{q}{i}").queue(f"team-{q}").seq(i).build() for q in "ab" for i in range(gpus)]
    result = run(snapshot, jobs, profile("default"))
    return [p.job[0] for p in result.placements]


def test_fair_share_interleaves_queues_by_dominant_share() -> None:
    assert "".join(interleaving(1.0, 8)) == "abababab"


def test_fair_share_respects_weight() -> None:
    order = interleaving(2.0, 9)
    assert Counter(order) == {"a": 6, "b": 3}
    # Shares in 18ths (a's over weight 2): a goes while a < b; on a tie the head with the lower
    # submit_seq goes (a2 vs b1 -> b).
    assert "".join(order) == "ababaabaa"


def test_fair_share_counts_what_queues_already_run() -> None:
    builder = cluster().nodes(2, "A100-80GB")
    n0, _ = builder.build()
    running = running_on(make_job("old").gpus(4).queue("team-a").build(), [(n0, range(4))])
    snapshot = builder.snapshot(running=[running], queues=[queue("team-a"), queue("team-b")])
    jobs = [make_job(f"{q}{i}").queue(f"team-{q}").seq(i).build() for q in "ab" for i in range(6)]
    result = run(snapshot, jobs, profile("default"))
    # team-b catches up with team-a's 4 running GPUs first, then they alternate until team-b runs out.
    assert [p.job for p in result.placements] == [
        *("b0", "b1", "b2", "b3"),
        *("a0", "b4", "a1", "b5"),
        *("a2", "a3", "a4", "a5"),
    ]


def test_fair_share_serves_queues_within_their_nominal_quota_before_borrowers() -> None:
    # team-a borrows (4 GPUs on a nominal of 2) yet has the smaller share; team-b is within nominal.
    builder = cluster().nodes(2, "A100-80GB")
    n0, n1 = builder.build()
    running = [
        running_on(make_job("a-old").gpus(4).queue("team-a").build(), [(n0, range(4))]),
        running_on(make_job("b-old").gpus(6).queue("team-b").build(), [(n1, range(6))]),
    ]
    queues = [queue("team-a").gpus(2).cohort("c"), queue("team-b").gpus(12).cohort("c")]
    snapshot = builder.snapshot(running=running, queues=queues)
    jobs = [make_job("a").queue("team-a").seq(0).build(), make_job("b").queue("team-b").seq(1).build()]
    result = run(snapshot, jobs, profile("default"))
    assert [p.job for p in result.placements] == ["b", "a"]


def test_fair_share_prefers_higher_priority_within_a_queue() -> None:
    jobs = [
        make_job("low").queue("team-a").priority(0).seq(0).build(),
        make_job("high").queue("team-a").priority(3).seq(1).build(),
    ]
    assert decided_order(jobs, "default") == ["high", "low"]


def test_a_custom_profile_can_use_any_registered_order() -> None:
    custom = build_profile("custom", "priority", (("spread", 1.0),))
    assert custom.describe() == (
        "order=priority, admit=gang+quota, filter=node_health+gpu_model+fits+spot, score=spread*1+spot_preference*10, "
        "select=pack, preempt=none"
    )
