"""`run_cycle` itself: queue discipline (strict FIFO vs backfill), bad input, canonical output."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpufleet.domain import ClusterSnapshot, GpufleetError, GpuShare, RunningJob, WorkerPlacement
from gpufleet.policies.catalog import PROFILES, profile
from gpufleet.scheduling.cycle import CycleResult, run_cycle
from gpufleet.scheduling.status import Code, Status
from tests.kit import cluster, codes, make_job, nodes_of, queue, run, run_cycles, running_on
from tests.kit.reasons import NO_VICTIM

# One node with 8 GPUs, 4 of them taken: a 6-GPU head does not fit, a 2-GPU job behind it does.
HALF = cluster().nodes(1, "A100-80GB")
(H,) = HALF.build()
HALF_BUSY = HALF.snapshot(running=[running_on(make_job("x").gpus(4).non_preemptible().build(), [(H, range(4))])])
HEAD = make_job("head").gpus(6).submitted(1).build()
SMALL = make_job("small").gpus(2).submitted(2).build()


@pytest.mark.parametrize(
    ("profile_name", "placed", "small_status"),
    [
        pytest.param("fifo", [], ("wait", "behind job head in queue default (strict FIFO)"), id="strict-fifo-blocks"),
        pytest.param("fifo-backfill", ["small"], None, id="backfill"),
        pytest.param("best-fit", ["small"], None, id="best-fit-backfills"),
        pytest.param("default", ["small"], None, id="default-backfills"),
    ],
)
def test_head_of_line_blocking(profile_name: str, placed: list[str], small_status: tuple[str, str] | None) -> None:
    result = run(HALF_BUSY, [SMALL, HEAD], profile(profile_name))
    assert [p.job for p in result.placements] == placed
    assert result.waiting["head"].code is Code.UNSCHEDULABLE
    if small_status is not None:
        status = result.waiting["small"]
        assert (status.code.value, status.message()) == small_status


def test_strict_fifo_blocks_only_the_heads_own_queue() -> None:
    other = make_job("other").gpus(2).queue("team-b").submitted(3).build()
    result = run(HALF_BUSY, [SMALL, HEAD, other], profile("fifo"))
    assert [p.job for p in result.placements] == ["other"]
    assert codes(result) == {"head": "unschedulable", "small": "wait"}


def test_strict_fifo_skips_a_head_that_can_never_run() -> None:
    impossible = make_job("impossible").gpus(9).submitted(0).build()
    result = run(HALF_BUSY, [SMALL, impossible], profile("fifo"))
    assert [p.job for p in result.placements] == ["small"]
    assert result.waiting["impossible"].code is Code.UNRESOLVABLE


def test_strict_fifo_still_tells_a_job_behind_the_head_that_it_can_never_run() -> None:
    impossible = make_job("impossible").gpus(9).submitted(5).build()
    result = run(HALF_BUSY, [SMALL, HEAD, impossible], profile("fifo"))
    assert codes(result) == {"head": "unschedulable", "small": "wait", "impossible": "unresolvable"}
    assert result.waiting["impossible"].reasons == ("needs 9 GPUs (any model) on one node; the largest node has 8",)


def test_backfill_over_several_cycles_lets_the_head_run_once_room_frees() -> None:
    snapshot = cluster().nodes(1, "A100-80GB").snapshot()
    first = make_job("first").gpus(4).submitted(0).build()
    results, final, waiting = run_cycles(snapshot, [first, HEAD, SMALL], profile("fifo-backfill"), cycles=1)
    assert [p.job for p in results[0].placements] == ["first", "small"]
    assert [j.id for j in waiting] == ["head"]
    finished = dataclasses.replace(final, running=tuple(r for r in final.running if r.id != "first"))
    assert nodes_of(run(finished, waiting, profile("fifo-backfill")), "head") == ["node-00"]


# ---- bad input ---------------------------------------------------------------------------------------


def test_a_job_pending_twice_is_an_error_and_no_copy_is_decided() -> None:
    job = make_job("j").build()
    twin = make_job("j").gpus(2).build()
    for pending in ([job, twin], [twin, job]):
        result = run(HALF.snapshot(), [*pending, make_job("k").build()], profile("default"))
        assert [p.job for p in result.placements] == ["k"]
        assert result.waiting == {
            "j": Status(Code.ERROR, ("job j is pending twice, or pending and running at once",), "cycle")
        }


def test_a_job_pending_and_running_at_once_is_an_error() -> None:
    result = run(HALF_BUSY, [make_job("x").build()], profile("default"))
    assert result.waiting["x"].code is Code.ERROR
    assert not result.placements


def test_a_snapshot_with_a_job_on_an_unknown_node_is_refused() -> None:
    ghost = RunningJob(make_job("g").build(), (WorkerPlacement("nowhere", (GpuShare(0),)),))
    with pytest.raises(GpufleetError, match="runs on node 'nowhere', which is not in the snapshot"):
        run_cycle(HALF.snapshot(running=[ghost]), [], profile("default"))


def test_a_snapshot_that_overcommits_a_gpu_is_refused() -> None:
    a = running_on(make_job("a").gpus(1).build(), [(H, [0])])
    b = running_on(make_job("b").fraction(0.5).build(), [(H, [0])])
    with pytest.raises(GpufleetError, match="overcommits node 'node-00'") as caught:
        run_cycle(HALF.snapshot(running=[a, b]), [], profile("default"))
    assert caught.value.fix


def test_a_snapshot_naming_a_gpu_the_node_lacks_is_refused() -> None:
    bad = running_on(make_job("a").gpus(1).build(), [(H, [0])])
    bad = dataclasses.replace(bad, workers=(WorkerPlacement("node-00", (GpuShare(8),)),))
    with pytest.raises(GpufleetError, match="holds a GPU index that node 'node-00' does not have"):
        run_cycle(HALF.snapshot(running=[bad]), [], profile("default"))


@pytest.mark.parametrize("profile_name", sorted(PROFILES))
def test_nothing_pending_decides_nothing(profile_name: str) -> None:
    result = run(HALF_BUSY, [], profile(profile_name))
    assert result == CycleResult((), (), {})


@pytest.mark.parametrize("profile_name", sorted(PROFILES))
def test_an_empty_cluster_leaves_every_job_waiting(profile_name: str) -> None:
    snapshot = ClusterSnapshot(())
    jobs = [make_job("gpu").gpus(1).build(), make_job("cpu").cpu_only().cpu(1).build()]
    result = run(snapshot, jobs, profile(profile_name))
    assert codes(result) == {"gpu": "unresolvable", "cpu": "unresolvable"}


def test_cpu_only_jobs_run_on_cpu_nodes() -> None:
    snapshot = cluster().cpu_nodes(1, cpu=8).nodes(1, "T4", gpus=1, cpu=8).snapshot()
    jobs = [make_job(f"c{i}").cpu_only().cpu(4).seq(i).build() for i in range(5)]
    result = run(snapshot, jobs, profile("default"))
    assert len(result.placements) == 4
    assert all(p.workers[0].gpus == () for p in result.placements)


# ---- output ------------------------------------------------------------------------------------------


def test_to_json_is_canonical() -> None:
    snapshot = cluster().nodes(2, "A100-80GB").snapshot(queues=[queue("default").gpus(4)])
    jobs = [make_job("b").gpus(4).seq(1).build(), make_job("a").fraction(0.5).seq(0).build()]
    result = run(snapshot, jobs, profile("default"))
    text = result.to_json()
    assert text == result.to_json()
    decoded = json.loads(text)
    assert list(decoded) == ["placements", "preemptions", "waiting"]
    assert decoded["placements"] == [
        {"job": "a", "workers": [{"cpu_milli": 0, "gpus": [[0, 500, 0]], "memory": 0, "node": "node-00"}]}
    ]
    assert decoded["waiting"] == {
        "b": {
            "code": "unschedulable",
            "plugin": "quota",
            "reasons": [
                "queue default at its GPU quota (0.5/4: asks 4 more, may use nominal 4)",
                NO_VICTIM,
            ],
        }
    }
    assert text == json.dumps(decoded, sort_keys=True, separators=(",", ":"))


def test_the_same_input_gives_the_same_bytes() -> None:
    snapshot = cluster().nodes(3, "A100-80GB", nvlink_groups=2).nodes(1, "H100", gpus=4).snapshot()
    jobs = [make_job(f"j{i}").gpus(1 + i % 4).workers(1 + i % 2).priority(i % 3).seq(i).build() for i in range(12)] + [
        make_job(f"f{i}").fraction(0.25 * (1 + i % 3)).seq(20 + i).build() for i in range(6)
    ]
    for name in sorted(PROFILES):
        first = run(snapshot, jobs, profile(name)).to_json()
        assert run(snapshot, list(reversed(jobs)), profile(name)).to_json() == first, name


def test_inputs_are_not_mutated() -> None:
    snapshot = HALF_BUSY
    jobs = [HEAD, SMALL]
    before = (repr(snapshot), repr(jobs))
    run(snapshot, jobs, profile("default"))
    assert (repr(snapshot), repr(jobs)) == before
