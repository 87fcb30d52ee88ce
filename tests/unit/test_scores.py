"""Score plugins: the exact scores per node, and where a cycle then puts the job."""

from __future__ import annotations

import pytest

from gpufleet.domain import Job
from gpufleet.policies.catalog import build_profile, profile
from gpufleet.policies.score.bin_pack import BinPack
from gpufleet.policies.score.spread import Spread
from gpufleet.policies.score.topology import Topology
from gpufleet.scheduling.plugin_api import ScorePlugin
from tests.kit import cluster, gpus_of, make_job, nodes_of, run, running_on, score_nodes

# node-00 has 2 of 8 GPUs free and half its CPU taken; node-01 is empty.
HALF_FULL = cluster().nodes(2, "A100-80GB", gpus=8, cpu=96)
N0, N1 = HALF_FULL.build()
SIX = make_job("six").gpus(6).cpu(48).build()
PARTLY_USED = HALF_FULL.snapshot(running=[running_on(SIX, [(N0, range(6))])])


@pytest.mark.parametrize(
    ("plugin", "job", "expected"),
    [
        pytest.param(BinPack(), make_job("j").gpus(1).build(), {"node-00": 87.5, "node-01": 12.5}, id="bin_pack-gpu"),
        pytest.param(BinPack(), make_job("j").gpus(2).build(), {"node-00": 100.0, "node-01": 25.0}, id="bin_pack-fill"),
        pytest.param(
            BinPack(), make_job("j").fraction(0.5).build(), {"node-00": 81.25, "node-01": 6.25}, id="bin_pack-fraction"
        ),
        pytest.param(
            BinPack(),
            make_job("j").cpu_only().cpu(24).build(),
            {"node-00": 75.0, "node-01": 25.0},
            id="bin_pack-cpu-only-packs-by-cpu",
        ),
        pytest.param(Spread(), make_job("j").gpus(1).build(), {"node-00": 12.5, "node-01": 87.5}, id="spread-gpu"),
        pytest.param(
            Spread(), make_job("j").cpu_only().cpu(24).build(), {"node-00": 25.0, "node-01": 75.0}, id="spread-cpu"
        ),
    ],
)
def test_packing_scores(plugin: ScorePlugin, job: Job, expected: dict[str, float]) -> None:
    assert score_nodes(plugin, PARTLY_USED, job) == expected


@pytest.mark.parametrize(
    ("profile_name", "node"),
    [
        pytest.param("best-fit", "node-00", id="bin_pack-prefers-the-fuller-node"),
        pytest.param("spread", "node-01", id="spread-prefers-the-emptier-node"),
    ],
)
def test_packing_decides_the_node(profile_name: str, node: str) -> None:
    result = run(PARTLY_USED, [make_job("j").gpus(1).build()], profile(profile_name))
    assert nodes_of(result, "j") == [node]


def test_equal_scores_break_ties_by_node_name() -> None:
    snapshot = cluster().nodes(3, "A100-80GB").snapshot()
    for name in ("best-fit", "spread", "default"):
        assert nodes_of(run(snapshot, [make_job("j").gpus(2).build()], profile(name)), "j") == ["node-00"]


@pytest.mark.parametrize(
    ("profile_name", "expected"),
    [
        pytest.param("spread", ["node-00", "node-01", "node-02", "node-00"], id="spread-takes-turns"),
        pytest.param("default", ["node-00", "node-00", "node-00", "node-00"], id="bin_pack-fills-one-node"),
    ],
)
def test_each_placement_sees_the_scores_the_one_before_left(profile_name: str, expected: list[str]) -> None:
    """Identical jobs, one after the other: each one's scores reflect where the previous ones went
    (the core keeps scores per request class and must recompute the nodes that changed)."""
    snapshot = cluster().nodes(3, "A100-80GB").snapshot()
    jobs = [make_job(f"j{k}").gpus(2).submitted(k).build() for k in range(4)]
    result = run(snapshot, jobs, profile(profile_name))
    assert [nodes_of(result, f"j{k}")[0] for k in range(4)] == expected


# ---- topology ------------------------------------------------------------------------------------

# Two nodes, two NVLink groups of 4 GPUs each, 4 GPUs free on both: on node-00 two in each group,
# on node-01 a whole group.
NVLINK = cluster().nodes(2, "H100", gpus=8, nvlink_groups=2)
L0, L1 = NVLINK.build()
SPLIT = NVLINK.snapshot(
    running=[
        running_on(make_job("x").gpus(4).build(), [(L0, [0, 1, 4, 5])]),
        running_on(make_job("y").gpus(4).build(), [(L1, [0, 1, 2, 3])]),
    ]
)

TOPOLOGY_ONLY = build_profile("topology-only", "fifo", (("topology", 1.0),))


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        pytest.param(make_job("j").gpus(4).build(), {"node-00": 0.0, "node-01": 100.0}, id="4-gpus-one-group"),
        pytest.param(make_job("j").gpus(2).build(), {"node-00": 100.0, "node-01": 100.0}, id="2-gpus-fit-anywhere"),
        pytest.param(make_job("j").gpus(1).build(), {"node-00": 0.0, "node-01": 0.0}, id="single-gpu-indifferent"),
    ],
)
def test_topology_nvlink_scores(job: Job, expected: dict[str, float]) -> None:
    assert score_nodes(Topology(), SPLIT, job) == expected


@pytest.mark.parametrize("profile_name", ["default", "priority", "las"])
def test_a_4_gpu_worker_stays_inside_one_nvlink_group(profile_name: str) -> None:
    result = run(SPLIT, [make_job("j").gpus(4).build()], profile(profile_name))
    assert gpus_of(result, "j") == [("node-01", (4, 5, 6, 7))]


def test_topology_scores_later_gang_workers_by_node_then_rack() -> None:
    snapshot = cluster().nodes(2, "A100-80GB", rack="r1").nodes(2, "A100-80GB", rack="r2").snapshot()
    job = make_job("g").gpus(1).workers(3).build()
    scores = score_nodes(Topology(), snapshot, job, gang_nodes=["node-00"])
    assert scores == {"node-00": 100.0, "node-01": 30.0, "node-02": 0.0, "node-03": 0.0}


def test_topology_scores_a_gang_first_worker_by_room_and_rack() -> None:
    # r1: two empty nodes (16 free GPUs); r2: one empty node and one with 6 GPUs taken (10 free).
    builder = cluster().nodes(2, "A100-80GB", rack="r1").nodes(2, "A100-80GB", rack="r2")
    nodes = builder.build()
    snapshot = builder.snapshot(running=[running_on(make_job("x").gpus(6).build(), [(nodes[3], range(6))])])
    job = make_job("g").gpus(4).workers(2).build()
    # node-03 (2 free) does not pass the filters. Two parts, averaged: NVLink (1: 4 GPUs free in one
    # group) and gang = 0.7 * room for min(2, gang) workers / gang + 0.3 * rack's free GPUs / most free rack
    # (r1: 16, r2: 10). node-02: (1 + 0.7 + 0.3 * 10 / 16) / 2 = 0.94375.
    scores = score_nodes(Topology(), snapshot, job)
    assert scores == {"node-00": 100.0, "node-01": 100.0, "node-02": 94.375}


@pytest.mark.parametrize(
    ("profile_name", "expected_nodes"),
    [
        pytest.param("topology", ["node-00", "node-00"], id="topology-one-node"),
        pytest.param("default", ["node-00", "node-00"], id="default-one-node"),
        pytest.param("spread", ["node-00", "node-01"], id="spread-scatters"),
    ],
)
def test_a_gang_stays_on_one_node(profile_name: str, expected_nodes: list[str]) -> None:
    snapshot = cluster().nodes(3, "A100-80GB", rack="r1").snapshot()
    policy = TOPOLOGY_ONLY if profile_name == "topology" else profile(profile_name)
    result = run(snapshot, [make_job("g").gpus(4).workers(2).build()], policy)
    assert nodes_of(result, "g") == expected_nodes


def test_a_gang_too_big_for_one_node_stays_in_one_rack() -> None:
    # r1 has 2 nodes, r2 has 3: a gang of 3 whole-node workers fits in r2 alone.
    snapshot = cluster().nodes(2, "A100-80GB", rack="r1").nodes(3, "A100-80GB", rack="r2").snapshot()
    result = run(snapshot, [make_job("g").gpus(8).workers(3).build()], TOPOLOGY_ONLY)
    assert nodes_of(result, "g") == ["node-02", "node-03", "node-04"]
