"""The bounded progress history (`domain/progress.py`): throughput per size from consecutive reports of one
attempt, bounds that hold whatever a job sends, and the JSON form the store keeps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.progress import (
    MAX_LOSS_POINTS,
    MAX_SIZE_POINTS,
    JobProgress,
    Report,
    ReportContext,
    fold,
    progress_from_dict,
    progress_to_dict,
)


def progress(at: float, samples: float, loss: float = 1.0) -> Report:
    return Report("progress", at, {"samples": samples, "loss": loss})


def test_throughput_is_counted_per_size_and_never_across_attempts_or_sizes() -> None:
    history = fold(JobProgress(), [progress(0, 0), progress(10, 1000)], ReportContext(1, 2, 100))
    assert history.samples_per_s(2) == 100.0
    # Resized to 4 GPUs in the same attempt: the first report at the new size is an anchor, not a measurement.
    history = fold(history, [progress(40, 1100), progress(50, 3100)], ReportContext(1, 4, 100))
    assert history.samples_per_s(4) == 200.0
    assert history.samples_per_s(2) == 100.0
    # A new attempt restarts its counter from a checkpoint: samples going back are not negative throughput.
    history = fold(history, [progress(60, 900), progress(70, 2900)], ReportContext(2, 4, 100))
    assert history.samples_per_s(4) == 200.0
    assert [g for _, g in history.sizes] == [2, 4]
    assert history.reports == 6


def test_a_stall_longer_than_the_gap_is_not_throughput() -> None:
    history = fold(JobProgress(), [progress(0, 0), progress(5000, 10)], ReportContext(1, 1, 1e4))
    assert history.samples_per_s(1) is None


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(
        st.lists(
            st.tuples(st.floats(0, 1e6), st.floats(0, 1e9), st.floats(-10, 10), st.integers(1, 64)),
            min_size=1,
            max_size=300,
        ),
        min_size=1,
        max_size=8,
    )
)
def test_the_history_stays_bounded_and_round_trips_whatever_a_job_sends(
    batches: list[list[tuple[float, float, float, int]]],
) -> None:
    history = JobProgress()
    sent = 0
    for batch in batches:
        for at, samples, loss, gpus in batch:
            history = fold(history, [progress(at, samples, loss)], ReportContext(1, gpus, 1e6))
            sent += 1
    assert history.reports == sent
    assert len(history.loss_curve) <= MAX_LOSS_POINTS
    assert len(history.sizes) <= MAX_SIZE_POINTS
    assert len(history.throughput) <= 64
    assert all(entry.seconds >= 0 and entry.samples >= 0 for entry in history.throughput)
    assert progress_from_dict(progress_to_dict(history)) == history


def test_a_long_run_keeps_its_start_and_its_latest_points() -> None:
    reports = [progress(float(i), float(i), 1.0 / (i + 1)) for i in range(5000)]
    history = fold(JobProgress(), reports, ReportContext(1, 1, 1e6))
    curve = history.loss_curve
    assert len(curve) <= MAX_LOSS_POINTS
    assert curve[0] == (0.0, 1.0)
    assert curve[-1] == (4999.0, 1.0 / 5000)
    assert [s for s, _ in curve] == sorted(s for s, _ in curve)
