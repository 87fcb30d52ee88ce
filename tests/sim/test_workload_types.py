"""The shared types: WorkloadError, TraceJob, ThroughputTable, Workload, and the gang split rule."""

from __future__ import annotations

import pytest

from gpufleet.domain import GpufleetError, Job, QueueSpec, WorkerRequest, make_node
from gpufleet.sim.workload import ThroughputEntry, ThroughputTable, TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads._common import largest_remainder, split_gang


def _job(name: str, at: float = 0.0, seq: int = 0, queue: str = "q") -> TraceJob:
    return TraceJob(Job(id=name, queue=queue, request=WorkerRequest(gpus=1), submitted_at=at, submit_seq=seq), 60.0)


def _workload(*jobs: TraceJob) -> Workload:
    return Workload(
        name="w",
        citation="someone, somewhere",
        license="ok",
        nodes=(make_node("n0", "T4", 4, 16 * 1024**3),),
        queues=(QueueSpec("q"),),
        jobs=jobs,
    )


def test_workload_error_is_a_gpufleet_error_with_location_and_fix() -> None:
    err = WorkloadError("is 'x'", "write a number", path="/a/b.csv", line=7, column="num_gpu")
    assert isinstance(err, GpufleetError)
    assert str(err) == "/a/b.csv, line 7, column 'num_gpu': is 'x'; to fix: write a number"
    assert (err.message, err.fix) == ("/a/b.csv, line 7, column 'num_gpu': is 'x'", "write a number")
    assert str(WorkloadError("plain", "do this")) == "plain; to fix: do this"


def test_trace_job_properties_and_validation() -> None:
    tj = TraceJob(
        Job(id="a", queue="q", request=WorkerRequest(gpus=2), workers=2, submitted_at=5.0, job_type="LM"), 10.0, 40.0
    )
    assert (tj.id, tj.arrival, tj.job_type, tj.gpu_milli_total) == ("a", 5.0, "LM", 4000)
    assert _job("b").job_type is None
    with pytest.raises(WorkloadError, match="duration"):
        TraceJob(tj.job, 0.0)
    with pytest.raises(WorkloadError, match="gpu_seconds_total"):
        TraceJob(tj.job, None, -1.0)


def test_workload_checks_order_ids_and_queues() -> None:
    ok = _workload(_job("a", 0.0, 1), _job("b", 0.0, 2), _job("c", 1.0, 0))
    assert ok.gpu_count == 4
    assert ok.models == {"T4"}
    with pytest.raises(WorkloadError, match="not sorted"):
        _workload(_job("a", 1.0), _job("b", 0.0))
    with pytest.raises(WorkloadError, match="repeats"):
        _workload(_job("a", 0.0, 0), _job("a", 0.0, 1))
    with pytest.raises(WorkloadError, match="does not define"):
        _workload(_job("a", queue="elsewhere"))
    with pytest.raises(WorkloadError, match="citation"):
        Workload("w", " ", "l", (), (), ())


def test_expected_durations_are_an_opt_in_oracle() -> None:
    w = _workload(_job("a"), TraceJob(Job(id="b", queue="q", request=WorkerRequest(gpus=1), submit_seq=1)))
    oracle = w.with_expected_durations()
    assert [tj.job.expected_duration for tj in oracle.jobs] == [60.0, None]
    assert [tj.job.expected_duration for tj in w.jobs] == [None, None]


def test_throughput_table_validates_entries() -> None:
    table = ThroughputTable((ThroughputEntry("A", "v100", 1, 2.0), ThroughputEntry("A", "K80", 1, 1.0)))
    assert table.relative_speed("A", "V100", 1, reference="k80") == 2.0
    assert table.get("A", "V100", 1, consolidated=False) == 2.0  # one GPU: placement does not matter
    with pytest.raises(WorkloadError, match="reference"):
        table.relative_speed("A", "V100", 1)
    with pytest.raises(WorkloadError, match="twice"):
        ThroughputTable((ThroughputEntry("A", "v100", 1, 2.0), ThroughputEntry("A", "V100", 1, 3.0)))
    with pytest.raises(WorkloadError, match="finite throughput"):
        ThroughputTable((ThroughputEntry("A", "v100", 1, float("nan")),))
    with pytest.raises(WorkloadError, match="GPU count"):
        ThroughputTable((ThroughputEntry("A", "v100", 0, 1.0),))


@pytest.mark.parametrize(
    ("gpus", "per_node", "expected"),
    [
        (1, 8, (1, 1)),
        (8, 8, (1, 8)),
        (16, 8, (2, 8)),
        (12, 8, (2, 6)),
        (24, 8, (3, 8)),
        (128, 8, (16, 8)),
        (6, 4, (2, 3)),
        (48, 4, (12, 4)),
        (7, 4, (7, 1)),
    ],
)
def test_split_gang(gpus: int, per_node: int, expected: tuple[int, int]) -> None:
    assert split_gang(gpus, per_node) == expected


def test_largest_remainder_is_exact() -> None:
    assert largest_remainder(256, {"a": 0.5, "b": 0.3, "c": 0.2}) == {"a": 128, "b": 77, "c": 51}
    assert sum(largest_remainder(7, {"x": 1, "y": 1, "z": 1}).values()) == 7
