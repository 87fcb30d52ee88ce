"""Gavel-style heterogeneity: the `throughput` score, the `throughput_fair` order, the throughput table's new home."""

from __future__ import annotations

import numpy as np
import pytest

import gpufleet.sim.workload as sim_workload
from gpufleet.domain import (
    ClusterSnapshot,
    GpuShare,
    Job,
    QueueSpec,
    RunningJob,
    ThroughputEntry,
    ThroughputTable,
    WorkerPlacement,
    WorkerRequest,
    WorkloadError,
    make_node,
)
from gpufleet.domain.throughput_table import job_scale
from gpufleet.policies.catalog import PolicyData, build_profile, profile
from gpufleet.policies.order.throughput_fair import ThroughputFairShare, attained_seconds
from gpufleet.policies.score.throughput import ThroughputScore
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.placer import evaluate
from gpufleet.scheduling.plugin_api import GangContext, JobView
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.table import FloatArray

GIB = 1024**3
TABLE = ThroughputTable(
    (
        ThroughputEntry("resnet", "k80", 1, 1.0),
        ThroughputEntry("resnet", "p100", 1, 2.0),
        ThroughputEntry("resnet", "v100", 1, 4.0),
        ThroughputEntry("lstm", "k80", 1, 1.0),
        ThroughputEntry("lstm", "p100", 1, 1.2),
        ThroughputEntry("lstm", "v100", 1, 1.5),
        ThroughputEntry("oom", "k80", 1, 0.0),
        ThroughputEntry("oom", "v100", 1, 3.0),
        ThroughputEntry("resnet", "k80", 8, 4.0, consolidated=False),
        ThroughputEntry("resnet", "v100", 8, 8.0, consolidated=False),
    ),
    source="test",
    reference="V100",
)
NODES = (
    make_node("a-k80", "K80", 4, 12 * GIB),
    make_node("b-p100", "P100", 4, 16 * GIB),
    make_node("c-v100", "V100", 4, 16 * GIB),
)


def job(job_id: str, job_type: str, request: WorkerRequest | None = None, **fields: object) -> Job:
    return Job(id=job_id, queue="q", request=request or WorkerRequest(gpus=1), job_type=job_type, **fields)  # type: ignore[arg-type]


def scores(plugin: ThroughputScore, work: Job, snapshot: ClusterSnapshot | None = None) -> FloatArray:
    state = CycleState(snapshot or ClusterSnapshot(NODES))
    view = JobView(work, state.table.model_lut(work.request.models))
    evaluation = evaluate(build_profile("t", "fifo", ((plugin, 1.0),)), view, state)
    return plugin.score(view, state.view, evaluation, np.flatnonzero(evaluation.passed), GangContext())


# ---- the table moved to the domain ---------------------------------------------------------------------


def test_the_table_lives_in_the_domain_and_the_simulator_reexports_it() -> None:
    assert sim_workload.ThroughputTable is ThroughputTable
    assert sim_workload.ThroughputEntry is ThroughputEntry
    assert sim_workload.WorkloadError is WorkloadError
    with pytest.raises(WorkloadError, match="twice"):
        ThroughputTable((ThroughputEntry("a", "v100", 1, 1.0), ThroughputEntry("a", "V100", 1, 2.0)))


@pytest.mark.parametrize(
    ("work", "scale"),
    [
        pytest.param(job("j", "resnet"), (1, True), id="one-gpu"),
        pytest.param(job("j", "resnet", WorkerRequest(gpus=4)), (4, True), id="one-worker-of-4"),
        pytest.param(job("j", "resnet", WorkerRequest(gpus=4), workers=2), (8, False), id="gang-spans-nodes"),
    ],
)
def test_job_scale(work: Job, scale: tuple[int, bool]) -> None:
    assert job_scale(work) == scale


# ---- the score -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("work", "expected"),
    [
        # Largest gain in the table at 1 GPU: resnet, 4x from K80 to V100. Scores: 100 * (gain - 1) / 3.
        pytest.param(job("j", "resnet"), [0.0, 100 / 3, 100.0], id="gains-a-lot"),
        pytest.param(job("j", "lstm"), [0.0, 20 / 3, 50 / 3], id="gains-little"),
        pytest.param(job("j", "oom"), [0.0, 0.0, 0.0], id="zero-throughput-and-unmeasured"),
        pytest.param(job("j", "unknown"), [0.0, 0.0, 0.0], id="unknown-type"),
        pytest.param(job("j", "resnet", WorkerRequest(gpus=1, gpu_milli=500)), [0.0, 0.0, 0.0], id="fractional"),
        pytest.param(job("j", "resnet", WorkerRequest(cpu_milli=1000)), [0.0, 0.0, 0.0], id="cpu-only"),
    ],
)
def test_score_is_the_gain_over_the_slowest_model_scaled_by_the_largest_gain(work: Job, expected: list[float]) -> None:
    assert scores(ThroughputScore(TABLE), work).tolist() == pytest.approx(expected)


def test_oom_gain_is_measured_from_the_slowest_model_it_runs_on() -> None:
    assert ThroughputScore(TABLE).gains("oom", 1, True) == {"K80": 0.0, "V100": 1.0}


def test_a_gang_reads_its_unconsolidated_scale() -> None:
    gang = job("g", "resnet", WorkerRequest(gpus=4), workers=2)
    assert scores(ThroughputScore(TABLE), gang).tolist() == pytest.approx([0.0, 0.0, 100.0])


def test_without_a_table_the_score_is_neutral() -> None:
    assert scores(ThroughputScore(), job("j", "resnet")).tolist() == [0.0, 0.0, 0.0]


def test_jobs_that_gain_little_are_placed_by_packing_and_those_that_gain_much_by_speed() -> None:
    # K80 node has 1 GPU left (packing loves it), the V100 node is empty (packing dislikes it).
    hog = Job(id="hog", queue="q", request=WorkerRequest(gpus=3))
    running = (RunningJob(hog, (WorkerPlacement("a-k80", tuple(GpuShare(g) for g in range(3))),)),)
    snapshot = ClusterSnapshot((NODES[0], NODES[2]), running)
    gavel = profile("gavel-greedy", PolicyData(throughput=TABLE))
    for job_type, node in (("lstm", "a-k80"), ("resnet", "c-v100")):
        result = run_cycle(snapshot, [job("j", job_type)], gavel)
        assert result.placements[0].workers[0].node == node, job_type


# ---- the order -----------------------------------------------------------------------------------------


TWO_MODELS = (make_node("k80", "K80", 4, 12 * GIB), make_node("v100", "V100", 4, 16 * GIB))


def on(node: str, work: Job, gpus: int = 1) -> RunningJob:
    return RunningJob(work, (WorkerPlacement(node, tuple(GpuShare(g) for g in range(gpus))),))


def test_speedups_are_relative_to_the_cluster_mix() -> None:
    plugin = ThroughputFairShare(TABLE)
    mix = plugin.mix(CycleState(ClusterSnapshot(TWO_MODELS)).view)
    assert mix == (("K80", 4), ("V100", 4))
    # resnet on half K80, half V100 averages 2.5 steps/s; lstm 1.25.
    assert plugin.speedups(mix, job("r", "resnet")) == pytest.approx({"K80": 0.4, "V100": 1.6})
    assert plugin.speedups(mix, job("l", "lstm")) == pytest.approx({"K80": 0.8, "V100": 1.2})
    assert plugin.speedups(mix, job("u", "unknown")) == {}


def test_a_queue_rate_counts_its_running_jobs_normalised() -> None:
    a = Job(id="ra", queue="a", request=WorkerRequest(gpus=1), job_type="resnet")
    wide = Job(id="wa", queue="a", request=WorkerRequest(gpus=2), job_type="resnet")  # 2 GPUs: not measured
    b = Job(id="lb", queue="b", request=WorkerRequest(gpus=1), job_type="lstm")
    c = Job(id="ub", queue="b", request=WorkerRequest(gpus=1), job_type="unknown")
    running = (
        on("v100", a),
        RunningJob(wide, (WorkerPlacement("v100", (GpuShare(1), GpuShare(2))),)),
        on("k80", b),
        RunningJob(c, (WorkerPlacement("k80", (GpuShare(1),)),)),
    )
    state = CycleState(ClusterSnapshot(TWO_MODELS, running))
    plugin = ThroughputFairShare(TABLE)
    assert plugin.normalised_rate("a", state.view) == pytest.approx(1.6 + 2.0)  # unmeasured: 1 per GPU
    assert plugin.normalised_rate("b", state.view) == pytest.approx(0.8 + 1.0)  # unknown type: 1 per GPU
    with state.without(["ra"]):
        assert plugin.normalised_rate("a", state.view) == 2.0
    assert ThroughputFairShare().normalised_rate("a", state.view) == 3.0  # no table: GPUs


def test_the_queue_with_the_least_normalised_rate_per_weight_goes_next() -> None:
    a = Job(id="ra", queue="a", request=WorkerRequest(gpus=1), job_type="resnet")
    b = Job(id="lb", queue="b", request=WorkerRequest(gpus=1), job_type="lstm")
    running = (on("v100", a), on("k80", b))
    weighted = CycleState(
        ClusterSnapshot(TWO_MODELS, running, queues=(QueueSpec("a", weight=2.0), QueueSpec("b")))
    ).view
    plugin = ThroughputFairShare(TABLE)
    assert plugin.queue_key("a", weighted) == pytest.approx((0.8,))  # 1.6 / weight 2
    assert plugin.queue_key("b", weighted) == pytest.approx((0.8,))
    snapshot = ClusterSnapshot(TWO_MODELS, running, queues=(QueueSpec("a"), QueueSpec("b")))
    pending = [
        Job(id="a1", queue="a", request=WorkerRequest(gpus=1), job_type="lstm", submit_seq=0),
        Job(id="b1", queue="b", request=WorkerRequest(gpus=1), job_type="lstm", submit_seq=1),
        Job(id="b2", queue="b", request=WorkerRequest(gpus=1), job_type="lstm", submit_seq=2),
    ]
    result = run_cycle(snapshot, pending, profile("gavel-greedy", PolicyData(throughput=TABLE)))
    # b (0.8) before a (1.6); b1 takes a V100 (lstm gains a little there): b is at 0.8 + 1.2 = 2.0, so a1.
    assert [(p.job, p.workers[0].node) for p in result.placements] == [
        ("b1", "v100"),
        ("a1", "v100"),
        ("b2", "v100"),
    ]


@pytest.mark.parametrize(
    ("work", "seconds"),
    [
        pytest.param(job("j", "x", WorkerRequest(gpus=2), attained_gpu_seconds=100.0), 50.0, id="two-gpus"),
        pytest.param(
            job("j", "x", WorkerRequest(gpus=1, gpu_milli=250), attained_gpu_seconds=10.0), 40.0, id="quarter"
        ),
        pytest.param(job("j", "x", WorkerRequest(cpu_milli=1), attained_gpu_seconds=0.0), 0.0, id="cpu-only"),
    ],
)
def test_attained_service_is_wall_time_on_the_jobs_gpus(work: Job, seconds: float) -> None:
    assert attained_seconds(work) == seconds


def test_within_a_queue_least_attained_service_goes_first() -> None:
    pending = [
        job("old-and-served", "resnet", attained_gpu_seconds=500.0, submit_seq=0),
        job("wide-served", "resnet", WorkerRequest(gpus=4), attained_gpu_seconds=800.0, submit_seq=1),
        job("new", "lstm", submit_seq=2),
    ]
    placed = run_cycle(ClusterSnapshot(TWO_MODELS), pending, profile("gavel-greedy", PolicyData(throughput=TABLE)))
    assert [p.job for p in placed.placements] == ["new", "wide-served", "old-and-served"]
