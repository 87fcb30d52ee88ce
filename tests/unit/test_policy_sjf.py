"""`sjf`: shortest expected duration first; jobs without one last, first in, first out."""

from __future__ import annotations

import pytest

from gpufleet.domain import ClusterSnapshot, Job, WorkerRequest, make_node
from gpufleet.policies.catalog import profile
from gpufleet.policies.order.sjf import ShortestJobFirst
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.state import CycleState

GIB = 1024**3
BIG = ClusterSnapshot(tuple(make_node(f"n{i}", "A100", 8, 80 * GIB) for i in range(4)))


def job(job_id: str, duration: float | None, *, at: float = 0.0, seq: int = 0, priority: int = 0) -> Job:
    return Job(
        id=job_id,
        queue=f"team-{seq % 2}",
        request=WorkerRequest(gpus=1),
        expected_duration=duration,
        submitted_at=at,
        submit_seq=seq,
        priority=priority,
    )


@pytest.mark.parametrize(
    ("duration", "at", "key"),
    [
        pytest.param(60.0, 5.0, (0, 60.0, 5.0), id="known"),
        pytest.param(None, 5.0, (1, 0.0, 5.0), id="unknown-goes-after-every-known"),
    ],
)
def test_job_key(duration: float | None, at: float, key: tuple[object, ...]) -> None:
    assert ShortestJobFirst().job_key(job("j", duration, at=at), CycleState(BIG).view) == key
    assert ShortestJobFirst().queue_key("team-0", CycleState(BIG).view) == ()


def test_jobs_go_shortest_first_across_queues_then_fifo_without_durations() -> None:
    jobs = [
        job("long", 3_600.0, at=0.0, seq=0),
        job("unknown-late", None, at=9.0, seq=1),
        job("short-late", 60.0, at=8.0, seq=2),
        job("short-early", 60.0, at=1.0, seq=3),
        job("unknown-early", None, at=2.0, seq=4),
        job("medium", 600.0, at=3.0, seq=5, priority=9),  # priority plays no part
    ]
    result = run_cycle(BIG, jobs, profile("sjf"))
    assert [p.job for p in result.placements] == [
        "short-early",
        "short-late",
        "medium",
        "long",
        "unknown-early",
        "unknown-late",
    ]


def test_a_short_job_that_does_not_fit_lets_longer_ones_go() -> None:
    small = ClusterSnapshot((make_node("n", "A100", 2, 80 * GIB),))
    wide = Job(id="wide", queue="q", request=WorkerRequest(gpus=4), expected_duration=10.0)
    result = run_cycle(small, [wide, job("long", 1_000.0, seq=1)], profile("sjf"))
    assert [p.job for p in result.placements] == ["long"]
    assert result.waiting["wide"].code.value == "unresolvable"
