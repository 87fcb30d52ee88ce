"""A large gang behind a stream of small jobs: it starves under plain backfill, and a reserved start (EASY backfill,
`+reserve=`) bounds its wait. Real simulations through the same control loop as `gpufleet up`."""

from __future__ import annotations

from gpufleet.sim.experiment import run_experiment
from gpufleet.sim.starvation_study import gang_stream, large_waits

THRESHOLD_S = 2 * 3600.0
LONGEST_LIMIT_S = 8 * 3600.0  # the longest run time limit in the stream (`gang_stream`)


def test_a_gang_behind_small_jobs_starves_without_a_reservation_and_is_bounded_with_one() -> None:
    workload = gang_stream(seed=7, hours=24)
    experiment = run_experiment(workload, ["fifo-backfill", "fifo-backfill+reserve=2h"])
    plain, plain_never, _ = large_waits(experiment.result("fifo-backfill"), workload)
    reserved, reserved_never, _ = large_waits(experiment.result("fifo-backfill+reserve=2h"), workload)
    small = [
        r.first_started_at - r.submitted_at
        for r in experiment.result("fifo-backfill").run.store.all()
        if r.id.startswith("small") and r.first_started_at is not None
    ]
    print({"plain_max_wait_s": max(plain), "reserved_max_wait_s": max(reserved), "small_max_wait_s": max(small)})
    assert plain_never == reserved_never == 0
    # Without: some gang waits far longer than any small job, which keep taking each GPU as it frees.
    assert max(plain) > 3 * max(small)
    # With: once it is the oldest waiting job past the threshold it starts by its reserved time, at most the longest
    # run time limit later; and the worst wait is far below the plain one.
    assert max(reserved) <= THRESHOLD_S + LONGEST_LIMIT_S
    assert max(reserved) < max(plain) / 2


def test_without_limits_a_reservation_drains_its_nodes_and_still_bounds_the_wait() -> None:
    workload = gang_stream(seed=7, hours=24, limits=False)
    experiment = run_experiment(workload, ["fifo-backfill", "fifo-backfill+reserve=2h"])
    plain = large_waits(experiment.result("fifo-backfill"), workload)[0]
    drained = large_waits(experiment.result("fifo-backfill+reserve=2h"), workload)[0]
    assert max(drained) <= THRESHOLD_S + LONGEST_LIMIT_S
    assert max(drained) < max(plain)


def test_a_parked_job_that_crosses_the_threshold_is_woken_and_reserved() -> None:
    """Nothing ends between the gang's arrival and the small jobs' (no event wakes it): the loop still decides it
    once it has waited past the threshold, so that the small jobs, longer than its reserved start, keep off."""
    from gpufleet.domain import GiB, Job, QueueSpec, WorkerRequest, make_node
    from gpufleet.sim.workload import TraceJob, Workload

    def job(job_id: str, gpus: int, at: float, seconds: float, seq: int) -> TraceJob:
        return TraceJob(Job(job_id, "default", WorkerRequest(gpus=gpus), submit_seq=seq, submitted_at=at,
                            expected_duration=seconds), seconds)  # fmt: skip

    jobs = [job(f"long{i}", 1, 0.0, 10_000.0, i) for i in range(4)]
    jobs.append(job("gang", 8, 1.0, 100.0, 4))
    jobs += [job(f"small{i}", 1, 7_300.0 + 100 * i, 20_000.0, 5 + i) for i in range(4)]
    workload = Workload(
        "parked", "test", "test", (make_node("n0", "A100-80GB", 8, 80 * GiB),), (QueueSpec("default"),), tuple(jobs)
    )
    experiment = run_experiment(workload, ["fifo-backfill", "fifo-backfill+reserve=2h"])
    started = {
        result.policy: {r.id: r.first_started_at for r in result.run.store.all()} for result in experiment.results
    }
    assert started["fifo-backfill"]["gang"] == 27_600.0  # once the last small job that went before it ended
    assert started["fifo-backfill+reserve=2h"]["gang"] == 10_000.0  # when the long jobs end
    assert all(started["fifo-backfill+reserve=2h"][f"small{i}"] == 10_100.0 for i in range(4))


def test_a_maintenance_window_known_from_the_start_keeps_jobs_that_would_run_into_it_off_its_node() -> None:
    """Maintenance on n0 from 3,600 s: a job without a limit goes to n1; one that ends before the window may use
    n0 meanwhile; one that would still run at 3,600 waits for the window's end rather than start there."""
    from gpufleet.domain import GiB, Job, QueueSpec, WorkerRequest, make_node
    from gpufleet.domain.jobs import RunSpec
    from gpufleet.domain.windows import Window
    from gpufleet.sim.workload import TraceJob, Workload

    def job(job_id: str, at: float, seconds: float, limit: float | None, seq: int) -> TraceJob:
        run = RunSpec(("train",), grace_s=60.0, max_runtime_s=limit)
        return TraceJob(
            Job(job_id, "default", WorkerRequest(gpus=4), submit_seq=seq, submitted_at=at, run=run), seconds
        )

    nodes = (make_node("n0", "A100-80GB", 4, 80 * GiB), make_node("n1", "A100-80GB", 4, 80 * GiB))
    jobs = (
        job("unlimited", 0.0, 20_000.0, None, 0),
        job("short", 100.0, 1_000.0, 1_000.0, 1),
        job("long", 1_200.0, 3_000.0, 3_000.0, 2),
    )
    maintenance = Window("fw", ("n0",), start=3_600.0, end=7_200.0)
    workload = Workload("maint", "test", "test", nodes, (QueueSpec("default"),), jobs, windows=(maintenance,))
    run = run_experiment(workload, ["fifo-backfill"]).results[0].run
    started = {r.id: r.first_started_at for r in run.store.all()}
    assert started == {"unlimited": 0.0, "short": 100.0, "long": 7_200.0}
    assert not [t for t in run.store.log if t.target.value == "evicting"]
