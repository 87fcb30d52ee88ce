"""The communication model in the simulator: a gang runs at the speed its placement's all-reduce allows, and the
comm study compares placements with the model off and on."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain import GiB, Job, QueueSpec, WorkerRequest, make_node
from gpufleet.domain.comm import CommNeeds
from gpufleet.policies.catalog import profile
from gpufleet.sim.comm_study import CommStudy, comm_workload, run_comm_study
from gpufleet.sim.engine import SimSettings, Simulation
from gpufleet.sim.workload import TraceJob, Workload
from gpufleet.sim.workloads import generate_synthetic

SEVEN_B = CommNeeds(14_000_000_000, 1.0)


def two_a100_nodes(job: Job, duration: float) -> Workload:
    return Workload(
        name="two-a100",
        citation="hand-made test workload",
        license="test",
        nodes=(make_node("n0", "A100-80GB", 8, 80 * GiB), make_node("n1", "A100-80GB", 8, 80 * GiB)),
        queues=(QueueSpec("q"),),
        jobs=(TraceJob(job, duration),),
    )


def gang(workers: int, comm: CommNeeds | None) -> Job:
    return Job("g", "q", WorkerRequest(gpus=1, cpu_milli=1000, memory=GiB), workers=workers, comm=comm)


@pytest.mark.parametrize("hidden", [False, True])
def test_a_gang_over_two_nodes_is_stretched_by_its_all_reduce(hidden: bool) -> None:
    # 16 GPUs on two whole A100 nodes: the ring runs at 8 ports x 25 GB/s = 200 GB/s; each 1 s step waits
    # 2*15/16 * 14 GB / 200 GB/s = 0.13125 s more, so an hour of compute takes 3600 * 1.13125 s, whether or not
    # the scheduler was told (`comm_hidden`): the physics is the simulator's.
    sim = Simulation(two_a100_nodes(gang(16, SEVEN_B), 3600.0), profile("fifo"), SimSettings(comm_hidden=hidden))
    (record,) = sim.run().store.all()
    assert record.finished_at is not None
    assert record.first_started_at is not None
    assert record.finished_at - record.first_started_at == pytest.approx(3600.0 * 1.13125)


def test_a_gang_inside_one_node_and_a_job_without_needs_run_at_full_speed() -> None:
    # 8 GPUs in one NVLink group: 2*7/8 * 14 GB / 300 GB/s = 0.08167 s a step.
    sim = Simulation(two_a100_nodes(gang(8, SEVEN_B), 3600.0), profile("fifo"))
    (record,) = sim.run().store.all()
    assert record.finished_at == pytest.approx(3600.0 * (1 + 14e9 * 1.75 / 300e9))
    plain = Simulation(two_a100_nodes(gang(16, None), 3600.0), profile("fifo"))
    (record,) = plain.run().store.all()
    assert record.finished_at == pytest.approx(3600.0)


def small_synthetic() -> Workload:
    return generate_synthetic(seed=3, nodes=6, jobs=40, arrival_rate_per_hour=20.0)


def test_the_study_workload_turns_multi_gpu_jobs_into_declared_one_gpu_gangs() -> None:
    workload = small_synthetic()
    study = comm_workload(workload, CommStudy(0.25, seed=3))
    assert study == comm_workload(workload, CommStudy(0.25, seed=3))  # seeded
    for before, after in zip(workload.jobs, study.jobs, strict=True):
        gpus = 0 if before.job.request.fractional else before.job.request.gpus * before.job.workers
        if gpus < 2:
            assert after == before
        else:
            assert after.job.comm is not None
            assert after.job.comm.max_overhead == 0.25
            assert (after.job.request.gpus, after.job.workers) == (1, gpus)
            assert after.duration == before.duration


def test_with_the_model_on_no_gang_runs_above_its_limit() -> None:
    report = run_comm_study(small_synthetic(), CommStudy(0.25, seed=3))
    off, on = report["variants"]["model off"], report["variants"]["model on"]
    assert report["gangs_with_comm_needs"] > 0
    assert on["gang_comm_overhead_max_pct"] <= 25.0
    assert off["gang_comm_overhead_max_pct"] > 25.0  # this seed has spread gangs the blind scheduler accepts
    assert 0 <= report["placements_changed"] <= report["placements_compared"]
    assert off["gangs_held_back_by_limit"] == 0  # the blind scheduler never hears of the limit
    assert on["gangs_held_back_by_limit"] >= max(1, on["jobs_unfinished"])


def test_the_cli_prints_the_study_as_json() -> None:
    result = CliRunner().invoke(
        app,
        ["sim", "-w", "synthetic", "--seed", "3", "--set", "nodes=6", "--set", "jobs=40", "--set",
         "arrival_rate_per_hour=20", "--comm-study", "25%", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["max_comm_overhead"] == 0.25
    assert set(report["variants"]) == {"model off", "model on"}
    bad = CliRunner().invoke(app, ["sim", "-w", "synthetic", "--set", "jobs=5", "--comm-study", "2"])
    assert bad.exit_code != 0
    assert "to fix" in bad.output


def test_a_study_job_keeps_its_identity() -> None:
    workload = small_synthetic()
    study = comm_workload(workload, CommStudy(None, seed=3))
    assert [t.id for t in study.jobs] == [t.id for t in workload.jobs]
    needs = [t.job.comm for t in study.jobs if t.job.comm is not None]
    assert needs
    assert all(n.max_overhead is None for n in needs)  # 'score': no limit
