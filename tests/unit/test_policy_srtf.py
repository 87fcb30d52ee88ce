"""`srtf`: shortest remaining time first, remaining = expected duration - attained GPU-seconds / GPUs."""

from __future__ import annotations

import pytest

from gpufleet.domain import ClusterSnapshot, Job, WorkerRequest, make_node
from gpufleet.policies.catalog import profile
from gpufleet.policies.order.srtf import ShortestRemainingTime, remaining_seconds
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.state import CycleState

GIB = 1024**3
BIG = ClusterSnapshot(tuple(make_node(f"n{i}", "A100", 8, 80 * GIB) for i in range(4)))


def job(
    job_id: str,
    duration: float | None,
    attained: float = 0.0,
    *,
    request: WorkerRequest | None = None,
    workers: int = 1,
    seq: int = 0,
    at: float = 0.0,
) -> Job:
    return Job(
        id=job_id,
        queue="q",
        request=request or WorkerRequest(gpus=1),
        workers=workers,
        expected_duration=duration,
        attained_gpu_seconds=attained,
        submit_seq=seq,
        submitted_at=at,
    )


@pytest.mark.parametrize(
    ("case", "remaining"),
    [
        pytest.param(job("a", 100.0), 100.0, id="not-started"),
        pytest.param(job("a", 100.0, 120.0, request=WorkerRequest(gpus=2)), 40.0, id="120-gpu-s-on-2-gpus-is-60-s"),
        pytest.param(job("a", 100.0, 120.0, request=WorkerRequest(gpus=2), workers=3), 80.0, id="gang-of-6-gpus"),
        pytest.param(job("a", 100.0, 25.0, request=WorkerRequest(gpus=1, gpu_milli=500)), 50.0, id="half-gpu"),
        pytest.param(job("a", 100.0, 1_000.0), 0.0, id="overran-clips-at-0"),
        pytest.param(job("a", 100.0, 50.0, request=WorkerRequest(cpu_milli=1_000)), 100.0, id="cpu-only"),
        pytest.param(job("a", None, 50.0), None, id="no-duration"),
    ],
)
def test_remaining_seconds(case: Job, remaining: float | None) -> None:
    assert remaining_seconds(case) == remaining


def test_job_key_puts_unknown_durations_last() -> None:
    plugin = ShortestRemainingTime()
    state = CycleState(BIG).view
    assert plugin.job_key(job("a", 100.0, 30.0, at=4.0), state) == (0, 70.0, 4.0)
    assert plugin.job_key(job("b", None, at=4.0), state) == (1, 0.0, 4.0)
    assert plugin.queue_key("q", state) == ()


def test_a_preempted_long_job_near_its_end_goes_before_a_fresh_shorter_one() -> None:
    jobs = [
        job("fresh-short", 300.0, seq=0),
        job("nearly-done", 3_600.0, 3_500.0, seq=1),  # 100 s left
        job("unknown", None, seq=2),
        job("half-done", 1_000.0, 1_000.0, request=WorkerRequest(gpus=2), seq=3),  # 500 s left
    ]
    result = run_cycle(BIG, jobs, profile("srtf"))
    assert [p.job for p in result.placements] == ["nearly-done", "fresh-short", "half-done", "unknown"]
