"""The checkpoint interval (Young 1974 / Daly 2006) against the published constants, the failure rate of a
placement (published defaults until a spot pool is observed), and the interval in every worker's env."""

from __future__ import annotations

import csv
import dataclasses
import math

import pytest

from gpufleet.adapters.local.worker_env import allocator_env
from gpufleet.domain import make_node
from gpufleet.domain.checkpoints import (
    DEFAULT_GPU_FAILURES_PER_HOUR,
    DEFAULT_SPOT_INTERRUPTIONS_PER_NODE_HOUR,
    INTERVAL_ENV,
    MIN_OBSERVED_NODE_HOURS,
    ObservedPool,
    failures_per_hour,
    optimal_interval,
    plan_checkpoints,
)
from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import RunningJob
from gpufleet.ports import Launch
from tests.kit.builders import make_job
from tests.kit.traces import published_constants

NODES = {
    "od": make_node("od", "H100", 8, 80 << 30),
    "sp1": dataclasses.replace(make_node("sp1", "V100", 4, 16 << 30), pool="spot", zone="us-east-1a"),
    "sp2": dataclasses.replace(make_node("sp2", "V100", 4, 16 << 30), pool="spot", zone="us-east-1a"),
}


def on(*nodes: str) -> tuple[WorkerPlacement, ...]:
    return tuple(WorkerPlacement(n, (GpuShare(0),)) for n in nodes)


def test_young_daly_numbers() -> None:
    # Llama 3's job MTBF (3.09 h between unexpected interruptions) and a 60 s checkpoint: ~19 minutes.
    assert optimal_interval(60.0, 3.09 * 3600) == pytest.approx(math.sqrt(2 * 60 * 11124), rel=1e-12)
    assert optimal_interval(60.0, 3.09 * 3600) == pytest.approx(1155.3, abs=0.1)
    assert optimal_interval(10.0, 5.0) == 5.0  # C >= 2M: Daly's answer is M
    for bad in [(0.0, 10.0), (10.0, -1.0), (math.nan, 10.0), (10.0, math.inf)]:
        with pytest.raises(GpufleetError, match="give seconds > 0"):
            optimal_interval(*bad)


def test_the_defaults_are_the_published_figures() -> None:
    rows = {r["key"]: r for r in csv.DictReader(published_constants().read_text().splitlines())}
    assert float(rows["llama3_per_gpu_mtbf_derived"]["value"]) == 1 / DEFAULT_GPU_FAILURES_PER_HOUR
    assert rows["young_optimal_interval"]["value"] == "sqrt(2*C*M)"


def test_a_placement_fails_with_any_gpu_of_its_nodes_and_with_its_spot_pool() -> None:
    rate, source = failures_per_hour(on("od"), NODES, {})
    assert rate == pytest.approx(8 * DEFAULT_GPU_FAILURES_PER_HOUR)
    assert "8 GPUs" in source
    rate, source = failures_per_hour(on("sp1", "sp2", "sp2"), NODES, {})
    assert rate == pytest.approx(8 * DEFAULT_GPU_FAILURES_PER_HOUR + 2 * DEFAULT_SPOT_INTERRUPTIONS_PER_NODE_HOUR)
    assert "not yet observed" in source
    thin = {"us-east-1a": ObservedPool(2.0, MIN_OBSERVED_NODE_HOURS / 2)}  # too few node-hours to trust
    assert failures_per_hour(on("sp1"), NODES, thin)[0] == pytest.approx(
        4 * DEFAULT_GPU_FAILURES_PER_HOUR + DEFAULT_SPOT_INTERRUPTIONS_PER_NODE_HOUR
    )
    seen = {"us-east-1a": ObservedPool(0.05, 12.0)}
    rate, source = failures_per_hour(on("sp1", "sp2"), NODES, seen)
    assert rate == pytest.approx(8 * DEFAULT_GPU_FAILURES_PER_HOUR + 2 * 0.05)
    assert "observed 0.05/node-h over 12.0 node-h" in source


def test_no_plan_without_a_reported_cost() -> None:
    assert plan_checkpoints(None, on("od"), NODES, {}) is None
    plan = plan_checkpoints(20.0, on("od"), NODES, {})
    assert plan is not None
    assert plan.interval_s == pytest.approx(math.sqrt(2 * 20.0 * 3600 / (8 * DEFAULT_GPU_FAILURES_PER_HOUR)))


def test_lost_work_reads_the_reported_checkpoint_then_the_declared_interval_then_the_start() -> None:
    job = make_job("a").gpus(1).build()
    running = RunningJob(job, on("od"), started_at=100.0)
    assert running.lost_work_seconds(1100.0) == 1000.0
    declared = RunningJob(dataclasses.replace(job, checkpoint_interval=300.0), on("od"), started_at=100.0)
    assert declared.lost_work_seconds(1100.0) == 100.0
    reported = dataclasses.replace(declared, last_checkpoint_at=1050.0)
    assert reported.lost_work_seconds(1100.0) == 50.0
    earlier_attempt = dataclasses.replace(declared, last_checkpoint_at=50.0)  # before this run started
    assert earlier_attempt.lost_work_seconds(1100.0) == 100.0


def test_every_worker_is_told_the_interval_and_none_without_one() -> None:
    job = make_job("g").gpus(1).workers(2).build()
    workers = (WorkerPlacement("od", (GpuShare(0),)), WorkerPlacement("od", (GpuShare(1),)))
    for interval, expected in [(1234.4, "1234"), (None, None)]:
        launch = Launch(job, 1, workers, checkpoint_interval_s=interval)
        for rank in range(2):
            env = allocator_env(launch, rank, NODES, master_addr="127.0.0.1", master_port=29500, emulated=True)
            assert env.get(INTERVAL_ENV) == expected
