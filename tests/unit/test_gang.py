"""Gang admission and placement: all or nothing, elastic min..max, and requests nothing could hold."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.domain import ClusterSnapshot, Job
from gpufleet.policies.catalog import PROFILES, profile
from gpufleet.scheduling.status import Code
from tests.kit import cluster, make_job, nodes_of, queue, run, running_on

# Two A100 nodes (8 GPUs, 96 cores, 1 TiB) and one H100 node with 4 GPUs.
FLEET = cluster().nodes(2, "A100-80GB", gpus=8).nodes(1, "H100", gpus=4, prefix="h100")


@pytest.mark.parametrize(
    ("job", "reason"),
    [
        pytest.param(
            make_job("j").gpus(9).build(),
            "needs 9 GPUs (any model) on one node; the largest node has 8",
            id="more-gpus-per-worker-than-any-node",
        ),
        pytest.param(
            make_job("j").gpus(5).models("H100").build(),
            "needs 5 GPUs (H100) on one node; the largest node has 4",
            id="more-gpus-than-any-node-of-the-model",
        ),
        pytest.param(
            make_job("j").gpus(1).models("V100", "T4").build(),
            "no node has GPU model T4|V100 (the cluster has: A100-80GB, H100)",
            id="unknown-model",
        ),
        pytest.param(
            make_job("j").gpus(8).workers(3).build(),
            "gang of 3 workers x 8 GPUs (any model); the cluster can hold at most 2 such workers",
            id="gang-bigger-than-the-cluster",
        ),
        pytest.param(
            make_job("j").gpus(3).workers(6).build(),
            "gang of 6 workers x 3 GPUs (any model); the cluster can hold at most 5 such workers",
            id="gang-counts-whole-workers-per-node",
        ),
        pytest.param(
            make_job("j").gpus(2).elastic(3, 8).models("H100").build(),
            "gang of 3 workers x 2 GPUs (H100); the cluster can hold at most 2 such workers",
            id="elastic-minimum-bigger-than-the-cluster",
        ),
        pytest.param(
            make_job("j").gpus(1).gpu_memory(81).build(),
            "no GPU (any model) has 81 GiB of memory",
            id="gpu-memory-beyond-any-gpu",
        ),
        pytest.param(
            make_job("j").cpu_only().cpu(97).build(),
            "needs 97 CPUs per worker; the largest node has 96",
            id="more-cpu-than-any-node",
        ),
        pytest.param(
            make_job("j").gpus(1).memory(1025).build(),
            "needs more memory per worker than any node has",
            id="more-memory-than-any-node",
        ),
    ],
)
@pytest.mark.parametrize("profile_name", sorted(PROFILES))
def test_impossible_requests_are_unresolvable(profile_name: str, job: Job, reason: str) -> None:
    result = run(FLEET.snapshot(), [job], profile(profile_name))
    assert result.waiting[job.id].code is Code.UNRESOLVABLE
    assert result.waiting[job.id].reasons == (reason,)
    assert result.waiting[job.id].plugin == "gang"
    assert not result.preemptions


def test_cordoned_nodes_still_count_for_what_could_ever_fit() -> None:
    snapshot = cluster().nodes(1, "A100-80GB").nodes(1, "A100-80GB", cordoned=True).snapshot()
    result = run(snapshot, [make_job("g").gpus(8).workers(2).build()], profile("default"))
    assert result.waiting["g"].code is Code.UNSCHEDULABLE


# ---- all or nothing --------------------------------------------------------------------------------

BUSY = FLEET.build()


def busy(gpus_taken_on_node_00: int) -> ClusterSnapshot:
    hog = make_job("hog").gpus(gpus_taken_on_node_00).non_preemptible().build()
    return FLEET.snapshot(running=[running_on(hog, [(BUSY[0], range(gpus_taken_on_node_00))])])


@pytest.mark.parametrize("profile_name", sorted(PROFILES))
def test_a_gang_that_does_not_fit_whole_takes_nothing(profile_name: str) -> None:
    # Free: 2 GPUs on node-00, 8 on node-01, 4 on h100-00 -> room for 0 + 2 + 1 workers of 4 GPUs.
    job = make_job("g").gpus(4).workers(4).build()
    result = run(busy(6), [job], profile(profile_name))
    assert not result.placements
    assert result.waiting["g"].code is Code.UNSCHEDULABLE
    assert result.waiting["g"].reasons[0] == "gang of 4 workers: only 3 fit in what is free now (all or nothing)"
    assert result.waiting["g"].plugin == "gang"


def test_a_gang_that_fits_is_placed_whole() -> None:
    job = make_job("g").gpus(4).workers(3).build()
    result = run(busy(6), [job], profile("default"))
    assert sorted(nodes_of(result, "g")) == ["h100-00", "node-01", "node-01"]


def test_a_gang_placed_worker_by_worker_rolls_back_when_a_worker_fails() -> None:
    # Gang admission counts the H100 node, but the queue's quota then narrows the job to A100s, where
    # only 2 workers fit: worker 3 fails and workers 1-2 are undone, so the next job finds node-01 free.
    snapshot = busy(6)
    queues = (queue("default").model_gpus("A100-80GB", 24).model_gpus("H100", 0).build(),)
    snapshot = dataclasses.replace(snapshot, queues=queues)
    jobs = [make_job("g").gpus(4).workers(3).seq(0).build(), make_job("after").gpus(8).seq(1).build()]
    result = run(snapshot, jobs, profile("fifo-backfill"))
    assert result.waiting["g"].code is Code.UNSCHEDULABLE
    assert result.waiting["g"].reasons == (
        "gang of 3 workers: only 2 fit together; worker 3: 0/3 nodes fit: 2 too few free GPUs, "
        "1 GPU model over the queue's quota",
    )
    assert result.waiting["g"].plugin == "placement"
    assert nodes_of(result, "after") == ["node-01"]


# ---- elastic ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("taken", "job", "workers"),
    [
        # It grows on the nodes its gang took (a later resize grows it further, re-placing it).
        pytest.param(
            0, make_job("e").gpus(2).elastic(2, 6).models("A100-80GB").build(), 4, id="grows-to-what-fits-on-its-node"
        ),
        pytest.param(0, make_job("e").gpus(4).elastic(3, 6).build(), 3, id="not-beyond-the-nodes-its-gang-filled"),
        pytest.param(0, make_job("e").gpus(1).elastic(2, 4).build(), 4, id="capped-at-max"),
        pytest.param(6, make_job("e").gpus(4).elastic(3, 6).build(), 3, id="min-exactly"),
        pytest.param(6, make_job("e").gpus(4).elastic(4, 6).build(), 0, id="below-min-nothing"),
        pytest.param(0, make_job("e").gpus(2).elastic(1, 8).models("H100").build(), 2, id="model-bound"),
    ],
)
def test_elastic_jobs_get_min_to_max_workers(taken: int, job: Job, workers: int) -> None:
    snapshot = busy(taken) if taken else FLEET.snapshot()
    result = run(snapshot, [job], profile("default"))
    if workers:
        assert len(result.placements[0].workers) == workers
    else:
        assert not result.placements
        assert result.waiting["e"].code is Code.UNSCHEDULABLE


def test_elastic_workers_grow_next_to_the_gang() -> None:
    snapshot = cluster().nodes(3, "A100-80GB").snapshot()
    result = run(snapshot, [make_job("e").gpus(2).elastic(2, 4).build()], profile("default"))
    assert nodes_of(result, "e") == ["node-00"] * 4


def test_a_profile_may_turn_elastic_growth_off() -> None:
    no_grow = dataclasses.replace(profile("default"), elastic_grow=False)
    result = run(FLEET.snapshot(), [make_job("e").gpus(4).elastic(2, 6).build()], no_grow)
    assert len(result.placements[0].workers) == 2
