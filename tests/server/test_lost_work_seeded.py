"""A seeded day and a half of a small cluster on the real SQLite store with the real control loop: jobs report
checkpoints (through the requests the API records), fail, lose their node and are preempted by more urgent
work; the lost-work report adds up to the losses counted independently here, attempt by attempt."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.control.reconciler import Reconciler
from gpufleet.domain import GiB, JobState, QueueSpec, make_node
from gpufleet.domain.costs import Pool, Price
from gpufleet.domain.jobs import RunSpec
from gpufleet.policies.catalog import profile
from gpufleet.ports import ObservationKind, RequestKind
from gpufleet.server.lost_work import lost_work_report
from tests.kit import make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

PRICE = 3.67
MINUTE = 60.0
STEP = 5 * MINUTE


@dataclass
class Run:
    started: float
    saved_at: float | None = None  # last checkpoint in this run
    saved_work: float = 0.0


def scenario(tmp_path: Path, seed: int) -> tuple[SqlStore, dict[str, float], dict[str, float]]:
    """Returns the store and, per queue, the work lost (GPU-seconds) and the attempts lost, as counted here."""
    rng = random.Random(seed)
    store = SqlStore.open(default_sqlite_url(tmp_path))
    store.set_nodes([make_node(f"n{i}", "A100-80GB", 8, 80 * GiB) for i in range(3)])
    for name in ("team-a", "team-b"):
        store.set_queue(QueueSpec(name))
    store.set_prices([Price("A100-80GB", Pool.ON_DEMAND, PRICE)], 0.0)
    clock, backend = ManualClock(), ScriptedBackend()
    loop = Reconciler(store, backend, clock, profile("default"))
    jobs = {}
    for i in range(30):
        job = make_job(f"j{i:02d}").gpus(rng.choice([2, 4, 8])).priority(rng.choice([0, 0, 1, 3]))
        job = job.queue(rng.choice(["team-a", "team-b"])).build()
        run = RunSpec(command=("train",), retries=5)
        every = rng.choice([None, 20 * MINUTE, 60 * MINUTE])
        work = rng.uniform(1, 8) * 3600
        jobs[job.id] = (dataclasses.replace(job, run=run), every, work, rng.uniform(0, 12 * 3600))
    runs: dict[str, Run] = {}
    progress: dict[str, float] = dict.fromkeys(jobs, 0.0)  # work saved so far (what a restart resumes from)
    lost_gpu_s: dict[str, float] = {}
    attempts: dict[str, float] = {}
    stops_seen = 0

    def ended(job_id: str, gpus: int) -> None:
        run = runs.pop(job_id)
        since = run.saved_at if run.saved_at is not None else run.started
        queue = jobs[job_id][0].queue
        lost_gpu_s[queue] = lost_gpu_s.get(queue, 0.0) + (clock.t - since) * gpus
        attempts[queue] = attempts.get(queue, 0) + 1

    submitted: set[str] = set()
    while clock.t < 36 * 3600:
        clock.t += STEP
        for job_id, (job, _every, _work, arrival) in jobs.items():
            if job_id not in submitted and arrival <= clock.t:
                store.submit(job, at=clock.t)
                submitted.add(job_id)
        for job_id, _attempt, _grace in backend.stops[stops_seen:]:
            if job_id in runs:
                backend.stopped(job_id, clock.t)
                ended(job_id, jobs[job_id][0].request.gpus)
        stops_seen = len(backend.stops)
        for launch in backend.launches:
            record = store.get(launch.job.id)
            if record is None or launch.job.id in runs or record.attempt != launch.attempt:
                continue
            if record.state is JobState.LAUNCHING:
                backend.started(launch.job.id, clock.t)
                runs[launch.job.id] = Run(clock.t, saved_work=progress[launch.job.id])
        for job_id, run in list(runs.items()):
            job, every, work, _ = jobs[job_id]
            gpus = job.request.gpus
            done = run.saved_work + (clock.t - run.started)
            if done >= work:
                backend.exited(job_id, clock.t, 0)
                runs.pop(job_id)
                continue
            if every is not None and clock.t - (run.saved_at or run.started) >= every:
                store.request(job_id, RequestKind.CHECKPOINT, "", at=clock.t, value=30.0)
                run.saved_at = clock.t
                progress[job_id] = done
            roll = rng.random()
            if roll < STEP / (20 * 3600):  # a failed worker about every 20 h of a job's run
                backend.exited(job_id, clock.t, 1)
                ended(job_id, gpus)
            elif roll < 2 * STEP / (20 * 3600):  # its node lost as often
                backend.observe(job_id, ObservationKind.LOST, clock.t)
                ended(job_id, gpus)
        loop.step()
    return store, lost_gpu_s, attempts


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1])
def test_the_lost_work_report_adds_up_to_each_attempts_loss(tmp_path: Path, seed: int) -> None:
    store, lost_gpu_s, attempts = scenario(tmp_path, seed)
    try:
        report = lost_work_report(store, 0.0, 36 * 3600 + 1)
        assert {g.key for g in report.groups} == set(lost_gpu_s)
        for group in report.groups:
            assert group.attempts == attempts[group.key]
            assert group.gpu_hours == pytest.approx(lost_gpu_s[group.key] / 3600)
            assert group.usd == pytest.approx(lost_gpu_s[group.key] / 3600 * PRICE)
            assert group.unpriced_gpu_hours == 0.0
        assert report.total.gpu_hours == pytest.approx(sum(lost_gpu_s.values()) / 3600)
        assert set(report.total.by_cause) <= {"preempted", "lost", "failed"}
        assert report.total.attempts >= 5  # the scenario does make losses of each kind
        assert len(report.total.by_cause) == 3
        print(f"\nseed {seed}: lost work by queue (36 h, 3 x 8 A100, 30 jobs)")
        for group in [*report.groups, report.total]:
            causes = ", ".join(f"{k} {v:.1f}" for k, v in sorted(group.by_cause.items()))
            print(f"  {group.key}: {group.attempts} attempts, {group.gpu_hours:.1f} GPU-h, ${group.usd:.2f} ({causes})")
    finally:
        store.close()
