"""GPU selection inside a node (`select/pack`): whole GPUs stay whole, NVLink groups stay intact."""

from __future__ import annotations

import pytest

from gpufleet.domain import ClusterSnapshot, Job
from gpufleet.policies.catalog import profile
from gpufleet.policies.select.pack import PackGpus
from tests.kit import cluster, gpus_of, make_job, run, running_on, select_gpus

# One node, 8 GPUs in two NVLink groups: 0-3 and 4-7.
NODE = cluster().nodes(1, "A100-80GB", gpus=8, nvlink_groups=2)
(N,) = NODE.build()


def holding(*held: tuple[Job, list[int]]) -> ClusterSnapshot:
    return NODE.snapshot(running=[running_on(job, [(N, gpus)]) for job, gpus in held])


TWO = make_job("two").gpus(2).build()
ONE = make_job("one").gpus(1).build()
HALF = make_job("half").fraction(0.5).build()
SEVENTY = make_job("seventy").fraction(0.7).build()


@pytest.mark.parametrize(
    ("snapshot", "job", "expected"),
    [
        pytest.param(holding(), make_job("j").gpus(4).build(), (0, 1, 2, 3), id="4-of-empty-node-first-group"),
        pytest.param(holding((TWO, [0, 1])), make_job("j").gpus(4).build(), (4, 5, 6, 7), id="4-in-the-free-group"),
        pytest.param(holding((TWO, [0, 1])), make_job("j").gpus(2).build(), (2, 3), id="2-best-fit-smaller-group"),
        pytest.param(holding((ONE, [4])), make_job("j").gpus(3).build(), (5, 6, 7), id="3-best-fit-exact-group"),
        pytest.param(
            holding((TWO, [0, 1])), make_job("j").gpus(6).build(), (2, 3, 4, 5, 6, 7), id="6-spans-largest-first"
        ),
        pytest.param(
            holding((ONE, [0]), (TWO, [4, 5])),
            make_job("j").gpus(4).build(),
            (1, 2, 3, 6),
            id="4-spans-larger-group-first",
        ),
        pytest.param(holding((HALF, [3])), make_job("j").fraction(0.5).build(), (3,), id="fraction-joins-shared-gpu"),
        pytest.param(
            holding((HALF, [3]), (SEVENTY, [6])),
            make_job("j").fraction(0.25).build(),
            (6,),
            id="fraction-tightest-shared-gpu",
        ),
        pytest.param(
            holding((HALF, [3]), (SEVENTY, [6])),
            make_job("j").fraction(0.4).build(),
            (3,),
            id="fraction-only-shared-gpu-with-room",
        ),
        pytest.param(
            holding((ONE, [0]), (TWO, [4, 5])),
            make_job("j").fraction(0.5).build(),
            (6,),
            id="fraction-new-gpu-from-emptiest-group",
        ),
        pytest.param(holding((HALF, [3])), make_job("j").gpus(1).build(), (0,), id="whole-never-takes-shared-gpu"),
    ],
)
def test_pack_selects(snapshot: ClusterSnapshot, job: Job, expected: tuple[int, ...]) -> None:
    assert select_gpus(PackGpus(), snapshot, job, "node-00") == expected


# ---- through a cycle -----------------------------------------------------------------------------

SMALL = cluster().nodes(1, "L4", gpus=2)


@pytest.mark.parametrize("profile_name", ["default", "fifo", "spread", "best-fit"])
def test_two_half_gpu_jobs_share_one_gpu(profile_name: str) -> None:
    jobs = [make_job("a").fraction(0.5).seq(1).build(), make_job("b").fraction(0.5).seq(2).build()]
    result = run(SMALL.snapshot(), jobs, profile(profile_name))
    assert gpus_of(result, "a") == gpus_of(result, "b") == [("node-00", (0,))]


def test_fractions_keep_the_other_gpu_whole_for_a_whole_gpu_job() -> None:
    jobs = [
        make_job("a").fraction(0.5).seq(1).build(),
        make_job("b").fraction(0.3).seq(2).build(),
        make_job("w").gpus(1).seq(3).build(),
        make_job("c").fraction(0.5).seq(4).build(),
    ]
    result = run(SMALL.snapshot(), jobs, profile("fifo-backfill"))
    assert [(p.job, gpus_of(result, p.job)) for p in result.placements] == [
        ("a", [("node-00", (0,))]),
        ("b", [("node-00", (0,))]),
        ("w", [("node-00", (1,))]),
    ]
    assert result.waiting["c"].reasons == ("0/1 nodes fit: 1 no GPU with a free share that large",)


def test_fractional_share_records_its_gpu_memory() -> None:
    result = run(SMALL.snapshot(), [make_job("a").fraction(0.25).gpu_memory(6).build()], profile("default"))
    (worker,) = result.placements[0].workers
    assert [(s.index, s.milli, s.memory) for s in worker.gpus] == [(0, 250, 6 * 1024**3)]


def test_whole_gpu_share_holds_all_its_memory() -> None:
    result = run(SMALL.snapshot(), [make_job("a").gpus(2).build()], profile("default"))
    (worker,) = result.placements[0].workers
    assert [(s.index, s.milli, s.memory) for s in worker.gpus] == [(0, 1000, 24 * 1024**3), (1, 1000, 24 * 1024**3)]
