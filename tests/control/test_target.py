"""FGD's target workload for a live cluster: learned from the submitted jobs' workers, generic when too few;
the control plane schedules and measures fragmentation with it."""

from __future__ import annotations

from pathlib import Path

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.control.target import MIN_WORKERS, learned_target
from gpufleet.domain import Job, QueueSpec, WorkerRequest
from gpufleet.domain.quotas import DEFAULT_QUEUE
from gpufleet.policies.score.fgd import FgdScore
from gpufleet.scheduling.fragmentation import GENERIC_TARGET, TargetWorkload
from gpufleet.server.control_plane import ControlPlane, UpSettings
from tests.kit import make_job


def mix(count: int) -> list[Job]:
    """Three quarters half-GPU jobs, a quarter gangs of two 2-GPU workers."""
    return [
        make_job(f"j{i:04d}").fraction(0.5).build() if i % 4 else make_job(f"j{i:04d}").gpus(2).workers(2).build()
        for i in range(count)
    ]


def test_too_few_workers_keep_the_generic_target() -> None:
    learned = learned_target(mix(10))
    assert learned.target is GENERIC_TARGET
    assert learned.source.startswith("generic")
    assert f"fewer than {MIN_WORKERS}" in learned.source


def test_each_worker_of_the_submitted_jobs_counts_as_one_request() -> None:
    jobs = mix(200)  # 150 half-GPU workers and 50 gangs of 2: 250 workers
    learned = learned_target(jobs)
    want = TargetWorkload.from_requests([WorkerRequest(gpus=1, gpu_milli=500)] * 150 + [WorkerRequest(gpus=2)] * 100)
    assert learned.target == want
    assert {(c.gpu_milli, c.gpus, c.weight) for c in learned.target.classes} == {(500, 1, 150.0), (1000, 2, 100.0)}
    assert "200 submitted jobs (250 workers, 2 classes)" in learned.source


def test_the_control_plane_schedules_and_measures_with_the_learned_target(tmp_path: Path) -> None:
    store = SqlStore.open(default_sqlite_url(tmp_path))
    store.set_queue(QueueSpec(DEFAULT_QUEUE))
    for job in mix(200):
        store.submit(job, at=0.0)
    store.close()
    plane = ControlPlane(UpSettings(data_dir=tmp_path, emulate="8xA100-80GB"))
    try:
        fgd = [plugin for plugin, _ in plane.reconciler.profile.scores if isinstance(plugin, FgdScore)]
        assert len(fgd) == 1
        assert fgd[0].target == learned_target(mix(200)).target != GENERIC_TARGET
        assert plane.telemetry.target == fgd[0].target
    finally:
        plane.close()
