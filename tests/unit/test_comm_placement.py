"""Placement with the communication model: the topology score prefers cheaper rings, a placement above a job's
`max_comm_overhead` is not taken (and `explain` says why, with the estimate), jobs without it place as before."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.domain import ClusterSnapshot, Job
from gpufleet.domain.comm import CommNeeds
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.status import Code
from tests.kit import cluster, make_job, nodes_of, run, running_on

DEFAULT = profile("default")
# 7B parameters in bf16 (14 GB of gradients), 1 s of compute per step.
SEVEN_B = CommNeeds(14_000_000_000, 1.0)


def with_comm(job: Job, needs: CommNeeds) -> Job:
    return dataclasses.replace(job, comm=needs)


def three_nodes_8_4_4() -> ClusterSnapshot:
    """Three 8-GPU A100 nodes; node-01 and node-02 have 4 GPUs taken: 16 free GPUs, as 8 + 4 + 4."""
    builder = cluster().nodes(3, "A100-80GB")
    nodes = builder.build()
    running = [running_on(make_job(f"x{i}").gpus(4).build(), [(nodes[i], range(4))]) for i in (1, 2)]
    return builder.snapshot(running=running)


def gang_16() -> Job:
    return make_job("g").gpus(4).workers(4).build()


def test_a_spread_above_the_limit_waits_and_explain_gives_the_estimate() -> None:
    job = with_comm(gang_16(), dataclasses.replace(SEVEN_B, max_overhead=0.15))
    result = run(three_nodes_8_4_4(), [job], DEFAULT)
    assert not result.placements
    status = result.waiting["g"]
    assert status.code is Code.UNSCHEDULABLE
    # 8 + 4 + 4: the ring runs at 4 ports x 25 GB/s = 100 GB/s; 2*15/16 * 14 GB / 100 GB/s = 0.2625 s a step,
    # 0.2625 / 1.2625 = 21 %. Two whole nodes (8 ports each, 200 GB/s) cost 0.13125 / 1.13125 = 12 %.
    assert status.message().startswith(
        "spread over 3 nodes: ~21 % of each step in all-reduce (16 GPUs, slowest link network at 100 GB/s, "
        "262 ms a step), above its max_comm_overhead of 15 %; waits for 2 whole nodes (~12 %)"
    )


def test_the_same_gang_without_a_limit_is_placed_and_without_needs_places_as_before() -> None:
    snapshot = three_nodes_8_4_4()
    plain = run(snapshot, [gang_16()], DEFAULT)
    assert sorted(set(nodes_of(plain, "g"))) == ["node-00", "node-01", "node-02"]
    scored = run(snapshot, [with_comm(gang_16(), SEVEN_B)], DEFAULT)
    assert nodes_of(scored, "g") == nodes_of(plain, "g")  # nothing better exists: the score cannot help


def test_once_two_whole_nodes_are_free_the_gang_takes_them() -> None:
    builder = cluster().nodes(3, "A100-80GB")
    nodes = builder.build()
    snapshot = builder.snapshot(running=[running_on(make_job("x").gpus(4).build(), [(nodes[2], range(4))])])
    job = with_comm(gang_16(), dataclasses.replace(SEVEN_B, max_overhead=0.15))
    result = run(snapshot, [job], DEFAULT)
    assert sorted(nodes_of(result, "g")) == ["node-00"] * 2 + ["node-01"] * 2


def test_the_score_prefers_the_nodes_with_the_faster_network() -> None:
    # node-00/01 have a slow network (12.5 GB/s per GPU, e.g. 100 Gb/s Ethernet); node-02/03 InfiniBand HDR.
    # Without the model the gang takes the first nodes by name; with it, the fast pair.
    slow = cluster().nodes(2, "A100-80GB").build()
    fast = cluster().nodes(2, "A100-80GB", prefix="zfast").build()
    nodes = [dataclasses.replace(n, network_gbps=12.5) for n in slow] + list(fast)
    snapshot = ClusterSnapshot(tuple(nodes), ())
    gang = make_job("g").gpus(8).workers(2).build()
    assert sorted(nodes_of(run(snapshot, [gang], DEFAULT), "g")) == ["node-00", "node-01"]
    aware = run(snapshot, [with_comm(gang, SEVEN_B)], DEFAULT)
    assert sorted(nodes_of(aware, "g")) == ["zfast-00", "zfast-01"]


def test_no_placement_on_the_inventory_within_the_limit_is_unresolvable_with_a_fix() -> None:
    job = with_comm(gang_16(), dataclasses.replace(SEVEN_B, max_overhead=0.05))
    result = run(cluster().nodes(3, "A100-80GB").snapshot(), [job], DEFAULT)
    status = result.waiting["g"]
    assert status.code is Code.UNRESOLVABLE
    assert "no placement on these nodes is within it (the cheapest, 2 whole nodes: ~12 %)" in status.message()
    assert "to fix: raise max_comm_overhead" in status.message()


def test_a_worker_across_nvlink_groups_pays_pcie() -> None:
    # One worker of 8 GPUs on a node of two NVLink groups of 4: its ring crosses PCIe (32 GB/s):
    # 2*7/8 * 14 GB / 32 GB/s = 0.766 s, 43 % of a 1 s step.
    job = with_comm(make_job("w").gpus(8).build(), dataclasses.replace(SEVEN_B, max_overhead=0.3))
    result = run(cluster().nodes(1, "A100-80GB", nvlink_groups=2).snapshot(), [job], DEFAULT)
    assert result.waiting["w"].code is Code.UNRESOLVABLE
    assert (
        result.waiting["w"]
        .message()
        .startswith("on one node: ~43 % of each step in all-reduce (8 GPUs, slowest link pcie at 32 GB/s")
    )


@pytest.mark.parametrize("limit", [None, 0.5])
def test_single_gpu_jobs_never_pay(limit: float | None) -> None:
    job = with_comm(make_job("one").gpus(1).build(), dataclasses.replace(SEVEN_B, max_overhead=limit))
    result = run(cluster().nodes(1, "A100-80GB").snapshot(), [job], DEFAULT)
    assert [p.job for p in result.placements] == ["one"]


def test_when_the_profiles_pick_passes_the_limit_the_nodes_within_it_are_tried() -> None:
    # Two GPUs all-reducing 14 GB: over PCIe (a T4 node, 32 GB/s) 0.44 s a step, 30 % of 1 s; over an A100's
    # NVLink (300 GB/s) 4 %. `best-fit` has no topology score and takes the T4 node (first by name, both empty);
    # the gate refuses it and the job is placed again on the nodes that can carry its ring within the limit.
    best_fit = profile("best-fit")
    snapshot = cluster().nodes(1, "T4", prefix="a-t4").nodes(1, "A100-80GB", prefix="b-a100").snapshot()
    plain = make_job("two").gpus(2).build()
    assert nodes_of(run(snapshot, [plain], best_fit), "two") == ["a-t4-00"]
    assert nodes_of(run(snapshot, [with_comm(plain, SEVEN_B)], best_fit), "two") == ["a-t4-00"]  # no limit
    declared = with_comm(plain, dataclasses.replace(SEVEN_B, max_overhead=0.2))
    assert nodes_of(run(snapshot, [declared], best_fit), "two") == ["b-a100-00"]
    spread = with_comm(make_job("g").gpus(1).workers(4).build(), dataclasses.replace(SEVEN_B, max_overhead=0.2))
    assert nodes_of(run(snapshot, [spread], best_fit), "g") == ["b-a100-00"] * 4
    # The topology score alone already prefers the NVLink node for a declaring job.
    assert nodes_of(run(snapshot, [with_comm(plain, SEVEN_B)], DEFAULT), "two") == ["b-a100-00"]
