"""The simulator's comparison profiles, `build_profile` with plugin instances, and `PolicyData`."""

from __future__ import annotations

import pytest

from gpufleet.domain import (
    ClusterSnapshot,
    Job,
    ThroughputEntry,
    ThroughputTable,
    UnknownNameError,
    WorkerRequest,
    make_node,
)
from gpufleet.policies.catalog import (
    ORDER,
    PROFILE_BUILDERS,
    PROFILES,
    ROUND_S,
    SCORE,
    SELECT,
    PolicyData,
    build_profile,
    profile,
)
from gpufleet.policies.order.throughput_fair import ThroughputFairShare
from gpufleet.policies.rounds.plugins import RoundOrder
from gpufleet.policies.score.fgd import FgdScore
from gpufleet.policies.score.throughput import ThroughputScore
from gpufleet.policies.select.fgd import FgdSelect
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.fragmentation import TargetWorkload

GIB = 1024**3
STANDARD = "admit=gang+quota, filter=node_health+gpu_model+fits+spot"
NEW = {
    "first-fit": f"order=fifo, {STANDARD}, score=spot_preference*10, select=pack, preempt=none",
    "random": f"order=fifo, {STANDARD}, score=random*1+spot_preference*10, select=pack, preempt=none",
    "fgd": f"order=fifo, {STANDARD}, score=fgd*1+spot_preference*10, select=fgd, preempt=none",
    "fgd-bf": f"order=fifo, {STANDARD}, score=fgd*1+best_fit*0.02+spot_preference*10, select=fgd, preempt=none",
    "fgd-fair": f"order=fair_share, {STANDARD}, score=fgd*1+topology*1+spot_preference*10, "
    "select=fgd, preempt=priority",
    "sjf": f"order=sjf, {STANDARD}, score=bin_pack*1+topology*1+spot_preference*10, select=pack, preempt=none",
    "srtf": f"order=srtf, {STANDARD}, score=bin_pack*1+topology*1+spot_preference*10, select=pack, preempt=none",
    "gavel": "order=rounds, admit=gang+quota+rounds, filter=node_health+gpu_model+fits+spot, "
    "score=throughput*2+bin_pack*1+topology*1+spot_preference*10, select=pack, preempt=rounds, migrate=rounds, "
    "learner=rounds",
    "gavel-mmf": "order=rounds, admit=gang+quota+rounds, filter=node_health+gpu_model+fits+spot, "
    "score=bin_pack*1+topology*1+spot_preference*10, select=pack, preempt=rounds, learner=rounds",
    "max-min": "order=rounds, admit=gang+quota+rounds, filter=node_health+gpu_model+fits+spot, "
    "score=bin_pack*1+topology*1+spot_preference*10, select=pack, preempt=rounds, learner=rounds",
    "gavel-greedy": f"order=throughput_fair, {STANDARD}, score=throughput*2+bin_pack*1+topology*1+spot_preference*10, "
    "select=pack, preempt=none",
    "tiresias": f"order=las, {STANDARD}, score=topology*2+bin_pack*1+spot_preference*10, select=pack, preempt=las",
}
TABLE = ThroughputTable((ThroughputEntry("a", "A100", 1, 2.0), ThroughputEntry("a", "T4", 1, 1.0)))


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_profiles(name: str) -> None:
    built = profile(name)
    assert built.name == name
    assert built.describe() == NEW[name]
    assert not built.strict_fifo


def test_profiles_and_builders_name_the_same_profiles() -> None:
    assert set(PROFILES) == set(PROFILE_BUILDERS)
    assert set(NEW) <= set(PROFILES)
    for name in sorted(PROFILES):
        assert PROFILES[name]().describe() == profile(name).describe()


def test_new_plugins_are_registered() -> None:
    assert {"sjf", "srtf", "throughput_fair"} <= set(ORDER.names())
    assert {"fgd", "random", "throughput"} <= set(SCORE.names())
    assert {"fgd", "pack"} <= set(SELECT.names())


def test_policy_data_reaches_the_plugins_that_need_it() -> None:
    workload = TargetWorkload.of([(500, 1, "", 1.0)])
    fgd = profile("fgd", PolicyData(target=workload))
    score, select = fgd.scores[0][0], fgd.select
    assert isinstance(score, FgdScore)
    assert isinstance(select, FgdSelect)
    assert score.target is workload
    assert select.target is workload
    assert select.memo is score.memo  # the select plugin reuses the GPU the score found
    greedy = profile("gavel-greedy", PolicyData(throughput=TABLE))
    assert isinstance(greedy.order, ThroughputFairShare)
    assert greedy.order.table is TABLE
    assert isinstance(greedy.scores[0][0], ThroughputScore)
    assert greedy.scores[0][0].table is TABLE
    assert profile("gavel-greedy").scores[0][0].table is None  # type: ignore[attr-defined]
    gavel = profile("gavel", PolicyData(throughput=TABLE))
    assert isinstance(gavel.order, RoundOrder)
    assert gavel.order.planner.table is TABLE
    assert gavel.round_s == ROUND_S
    assert gavel.job_specific
    assert profile("max-min", PolicyData(throughput=TABLE)).order.planner.table is None  # type: ignore[attr-defined]


def test_each_call_builds_fresh_plugins() -> None:
    assert profile("fgd").scores[0][0] is not profile("fgd").scores[0][0]
    assert PROFILES["gavel"]().order is not PROFILES["gavel"]().order


def test_build_profile_takes_instances_or_names() -> None:
    workload = TargetWorkload.of([(250, 1, "", 1.0)])
    score = FgdScore(workload)
    built = build_profile(
        "mine",
        ThroughputFairShare(TABLE),
        ((score, 1.0), ("bin_pack", 0.5)),
        select=FgdSelect(workload, memo=score.memo),
    )
    assert built.describe() == (
        f"order=throughput_fair, {STANDARD}, score=fgd*1+bin_pack*0.5+spot_preference*10, select=fgd, preempt=none"
    )
    assert built.scores[0][0] is score


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as caught:
        profile("fastest", PolicyData())
    assert "fgd-fair" in caught.value.fix
    assert "first-fit" in caught.value.fix


def test_first_fit_takes_the_first_node_by_name() -> None:
    nodes = tuple(make_node(name, "A100", 8, 80 * GIB) for name in ("c", "a", "b"))
    jobs = [Job(id=f"j{i}", queue="q", request=WorkerRequest(gpus=3), submit_seq=i) for i in range(4)]
    result = run_cycle(ClusterSnapshot(nodes), jobs, profile("first-fit"))
    assert [p.workers[0].node for p in result.placements] == ["a", "a", "b", "b"]


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_profiles_decide_the_same_bytes_whatever_the_input_order(name: str) -> None:
    nodes = tuple(make_node(f"n{i}", "A100" if i % 2 else "T4", 4, 80 * GIB, nvlink_groups=2) for i in range(4))
    jobs = [
        Job(
            id=f"j{i}",
            queue="q",
            request=WorkerRequest(gpus=1, gpu_milli=250 * (1 + i % 4)) if i % 3 == 0 else WorkerRequest(gpus=1 + i % 3),
            submit_seq=i,
            expected_duration=float(100 * (1 + (7 * i) % 5)),
            attained_gpu_seconds=float(10 * (i % 4)),
            job_type="a",
        )
        for i in range(14)
    ]
    data = PolicyData(throughput=TABLE)
    snapshot = ClusterSnapshot(nodes, seed=3)
    first = run_cycle(snapshot, jobs, profile(name, data))
    assert first.placements
    assert run_cycle(snapshot, list(reversed(jobs)), profile(name, data)).to_json() == first.to_json()
