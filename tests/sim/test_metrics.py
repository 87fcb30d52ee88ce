"""Metric math on hand-made workloads whose schedule is known, and the determinism of the event log."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from gpufleet.domain import GiB, Job, QueueSpec, WorkerRequest, make_node
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.records import JobRecord
from gpufleet.policies.catalog import profile
from gpufleet.sim.engine import Simulation
from gpufleet.sim.experiment import run_experiment, run_policy, scale_load
from gpufleet.sim.metrics import (
    Recorder,
    Summary,
    compute_metrics,
    jain_index,
    pending_times,
    time_average,
)
from gpufleet.sim.prices import prices_from
from gpufleet.sim.workload import TraceJob, Workload
from gpufleet.sim.workloads import generate_synthetic

S = JobState


def _job(job_id: str, queue: str, at: float, gpus: int = 1, milli: int = 1000, seq: int = 0) -> Job:
    return Job(job_id, queue, WorkerRequest(gpus=gpus, gpu_milli=milli), submit_seq=seq, submitted_at=at)


def two_jobs_one_gpu() -> Workload:
    """One node with one T4. A (queue qa) arrives at 0 and runs 100 s; B (queue qb) arrives at 10, runs 50 s.
    Under FIFO: A runs 0-100; B waits 10-100 and runs 100-150."""
    return Workload(
        name="two-jobs",
        citation="hand-made test workload",
        license="test",
        nodes=(make_node("n0", "T4", 1, 16 * GiB),),
        queues=(QueueSpec("qa"), QueueSpec("qb")),
        jobs=(TraceJob(_job("a", "qa", 0.0, seq=0), 100.0), TraceJob(_job("b", "qb", 10.0, seq=1), 50.0)),
    )


@pytest.fixture(scope="module")
def fifo_run() -> tuple[object, object]:
    workload = two_jobs_one_gpu()
    recorder = Recorder(workload)
    run = Simulation(workload, profile("fifo"), observer=recorder).run()
    return run, recorder.recording()


def test_job_times_of_a_known_schedule(fifo_run: tuple) -> None:
    run, recording = fifo_run
    m = compute_metrics(run, recording)
    assert (m.jobs, m.jobs_finished, m.jobs_unfinished, m.jobs_never_started) == (2, 2, 0, 0)
    assert m.jct.avg == pytest.approx(120.0)  # A 100 s, B 140 s
    assert (m.jct.p50, m.jct.max) == (pytest.approx(120.0), pytest.approx(140.0))
    assert m.queueing.avg == pytest.approx(45.0)  # A 0 s, B 90 s
    assert m.pending.avg == pytest.approx(45.0)  # never preempted: pending = first queueing
    assert m.slowdown.avg == pytest.approx((1.0 + 140.0 / 50.0) / 2)
    assert m.makespan_s == pytest.approx(150.0)
    assert m.gpu_alloc_pct == pytest.approx(100.0)  # the GPU is busy from 0 to 150
    assert m.gpu_hours_allocated == pytest.approx(150.0 / 3600.0)
    assert m.gpu_hours_by_model == {"T4": pytest.approx(150.0 / 3600.0)}
    assert (m.preemptions, m.backend_launches, m.lost_work_s) == (0, 2, 0.0)


def test_fairness_and_finish_time_fairness(fifo_run: tuple) -> None:
    run, recording = fifo_run
    m = compute_metrics(run, recording)
    # Jain over the two queues' mean slowdowns, 1 and 2.8.
    assert m.jain_slowdown == pytest.approx(3.8**2 / (2 * (1.0 + 2.8**2)))
    # Both queues received 100 and 50 GPU-seconds (weight 1).
    assert m.jain_gpu_share == pytest.approx(150.0**2 / (2 * (100.0**2 + 50.0**2)))
    # Jobs in the system: 1 on [0, 10), 2 on [10, 100), 1 on [100, 150). One GPU in the cluster.
    n_a = (1 * 10 + 2 * 90) / 100.0
    n_b = (2 * 90 + 1 * 50) / 140.0
    rho_a = 100.0 / (100.0 * n_a)
    rho_b = 140.0 / (50.0 * n_b)
    assert m.ftf_rho.avg == pytest.approx((rho_a + rho_b) / 2)
    assert m.ftf_unfair_pct == pytest.approx(50.0)
    queues = {q.name: q for q in m.queues}
    assert queues["qb"].avg_queueing_s == pytest.approx(90.0)
    assert queues["qa"].gpu_share_pct == pytest.approx(100.0 * 100 / 150)


def test_cost_uses_the_price_of_each_model_and_lists_unpriced_ones(fifo_run: tuple) -> None:
    run, recording = fifo_run
    priced = compute_metrics(run, recording, prices=prices_from({"T4": 0.36}))
    assert priced.cost_usd == pytest.approx(150.0 / 3600.0 * 0.36)
    assert priced.unpriced_models == ()
    unpriced = compute_metrics(run, recording, prices=prices_from({"V100": 2.48}))
    assert unpriced.cost_usd is None
    assert unpriced.unpriced_models == ("T4",)
    assert compute_metrics(run, recording).cost_usd is None  # no price table: no cost


def test_job_subset_restricts_job_metrics_only(fifo_run: tuple) -> None:
    run, recording = fifo_run
    m = compute_metrics(run, recording, job_ids={"b"})
    assert (m.jobs, m.jct.avg, m.queueing.avg) == (1, pytest.approx(140.0), pytest.approx(90.0))
    assert m.makespan_s == pytest.approx(150.0)  # cluster-level: the whole run
    assert m.gpu_hours_allocated == pytest.approx(150.0 / 3600.0)


def test_preemption_counts_and_pending_time_after_preemption() -> None:
    # A low-priority job holds the only GPU; a high-priority one arrives and preempts it.
    low = Job("low", "q", WorkerRequest(gpus=1), submit_seq=0, submitted_at=0.0, priority=0)
    high = Job("high", "q", WorkerRequest(gpus=1), submit_seq=1, submitted_at=10.0, priority=5)
    workload = Workload(
        name="preempt",
        citation="hand-made test workload",
        license="test",
        nodes=(make_node("n0", "T4", 1, 16 * GiB),),
        queues=(QueueSpec("q"),),
        jobs=(TraceJob(low, 100.0), TraceJob(high, 20.0)),
    )
    result = run_policy(workload, profile("priority"))
    m = result.metrics
    assert m.preemptions == 1
    assert m.jobs_preempted == 1
    assert m.backend_stops == 1
    records = {r.id: r for r in result.run.store.all()}
    assert records["low"].preemptions == 1
    pending = pending_times(result.run.store.all(), result.run.store.log, m.makespan_s)
    # low: pending from its preemption until it restarts after high finishes; never before its first start.
    assert pending["low"] > 0
    assert pending["low"] == pytest.approx(m.pending.max)
    assert m.jobs_finished == 2


def test_pending_times_from_a_hand_written_log() -> None:
    job = Job("j", "q", WorkerRequest(gpus=1))
    record = JobRecord(job, S.PENDING, submitted_at=5.0)
    log = [
        Transition("j", S.PENDING, S.ADMITTED, "placed", 8.0),
        Transition("j", S.ADMITTED, S.LAUNCHING, "launch", 8.0),
        Transition("j", S.LAUNCHING, S.RUNNING, "up", 8.0),
        Transition("j", S.RUNNING, S.EVICTING, "preempted", 20.0),
        Transition("j", S.EVICTING, S.PENDING, "stopped", 21.0),
        Transition("j", S.PENDING, S.ADMITTED, "placed", 30.0),
        Transition("j", S.ADMITTED, S.LAUNCHING, "launch", 30.0),
        Transition("j", S.LAUNCHING, S.RUNNING, "up", 31.0),
        Transition("j", S.RUNNING, S.PENDING, "node lost", 40.0),
    ]
    # 5->8, 21->30, and 40 -> end (50).
    assert pending_times([record], log, 50.0) == {"j": pytest.approx(3.0 + 9.0 + 10.0)}


def test_small_statistics() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([]) is None
    assert time_average([0.0, 10.0], [2.0, 4.0], 20.0) == pytest.approx(3.0)
    assert time_average([0.0, 10.0], [2.0, 4.0], 10.0) == pytest.approx(2.0)
    s = Summary.of([1.0, 2.0, 3.0, 4.0])
    assert (s.count, s.avg, s.p50, s.max) == (4, 2.5, 2.5, 4.0)
    assert Summary.of([]).flat("jct", "_s") == dict.fromkeys(
        ("avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "max_jct_s")
    )


def test_fgd_protocol_measures_at_arrived_load_steps() -> None:
    # Four 1-GPU pods that never leave on one 4-GPU node: each arrival adds 25 % of arrived load.
    pods = tuple(TraceJob(_job(f"p{i}", "q", float(i), seq=i), None) for i in range(4))
    workload = Workload(
        name="fgd-tiny",
        citation="hand-made test workload",
        license="test",
        nodes=(make_node("n0", "T4", 4, 16 * GiB),),
        queues=(QueueSpec("q"),),
        jobs=pods,
    )
    experiment = run_experiment(workload, ["best-fit"])
    assert experiment.fgd_protocol
    steps = experiment.results[0].metrics.fgd_steps
    assert [s.arrived_pct for s in steps] == list(range(0, 105, 5))
    by_step = {s.arrived_pct: s for s in steps}
    assert by_step[0].gpu_alloc_pct == pytest.approx(25.0)
    assert by_step[25].gpu_alloc_pct == pytest.approx(25.0)
    assert by_step[30].gpu_alloc_pct == pytest.approx(50.0)
    assert by_step[100].gpu_alloc_pct == pytest.approx(100.0)
    # Whole GPUs on whole GPUs: nothing is fragmented for a 1-GPU target, nothing is idle at the end.
    assert by_step[50].frag_gpu_pct_of_capacity == pytest.approx(0.0)
    assert by_step[100].frag_ratio_pct_of_idle == pytest.approx(0.0)
    d = experiment.results[0].metrics.as_dict()
    assert d["fgd_steps"][-1] == {
        "arrived_pct": 100,
        "arrived_gpu_pct": 100.0,
        "gpu_alloc_pct": 100.0,
        "frag_gpu_pct_of_capacity": 0.0,
        "frag_ratio_pct_of_idle": 0.0,
    }


def test_same_workload_same_event_log_byte_for_byte() -> None:
    workload = generate_synthetic(seed=3, jobs=120, nodes=6)

    def serialised(policy: str) -> bytes:
        run = Simulation(workload, profile(policy)).run()
        return json.dumps([asdict(t) for t in run.store.log]).encode()

    for policy in ("fifo", "default"):
        first, second = serialised(policy), serialised(policy)
        assert first == second
        assert len(first) > 1000


def test_metrics_are_deterministic_apart_from_timing() -> None:
    workload = generate_synthetic(seed=4, jobs=80, nodes=4)

    def metrics() -> dict:
        d = run_experiment(workload, ["las"]).results[0].metrics.as_dict()
        d.pop("timing")
        return d

    assert json.dumps(metrics()) == json.dumps(metrics())


def test_scale_load_compresses_arrivals_only() -> None:
    workload = generate_synthetic(seed=0, jobs=20, nodes=4)
    scaled = scale_load(workload, 4.0)
    t0 = workload.jobs[0].arrival
    for before, after in zip(workload.jobs, scaled.jobs, strict=True):
        assert after.arrival == pytest.approx(t0 + (before.arrival - t0) / 4.0)
        assert after.duration == before.duration
    assert "Load scale 4" in scaled.assumptions[-1]
    assert scale_load(workload, 1.0) is workload
