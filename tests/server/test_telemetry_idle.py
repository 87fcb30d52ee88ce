"""The reserved-but-idle detector and its usage accounting, tick by tick (pure: no thread, no clock)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.server.idle import Holder, IdleDetector

A = Holder("job-a", "team-a", 1000, since=0.0)
B = Holder("job-b", "team-b", 1000, since=0.0, preemptible=False)
G0, G1, G2 = ("n1", 0), ("n1", 1), ("n1", 2)


def feed(detector: IdleDetector, ticks: list[tuple[float, dict, dict]]) -> list:
    flags = []
    for now, holders, utils in ticks:
        flags.extend(detector.update(now, holders, utils).flagged)
    return flags


def test_a_job_is_flagged_once_its_gpu_stays_under_the_threshold_for_the_window() -> None:
    detector = IdleDetector(threshold_pct=5.0, window_s=10.0)
    holders = {G0: [A]}
    assert feed(detector, [(t, holders, {G0: 1.0}) for t in (0.0, 5.0)]) == []
    assert not detector.gpu_flagged(G0)
    flags = feed(detector, [(10.0, holders, {G0: 4.9})])
    assert [(f.job, f.queue, f.idle_since, f.flagged_at, f.gpus) for f in flags] == [
        ("job-a", "team-a", 0.0, 10.0, (G0,))
    ]
    assert detector.gpu_flagged(G0)
    # Flagged once: later idle ticks do not flag it again, but it stays flagged.
    assert feed(detector, [(15.0, holders, {G0: 0.0})]) == []
    assert set(detector.flagged_jobs()) == {"job-a"}


def test_a_busy_sample_an_unreadable_one_or_a_new_holder_restarts_the_window() -> None:
    detector = IdleDetector(threshold_pct=5.0, window_s=10.0)
    holders = {G0: [A]}
    feed(detector, [(0.0, holders, {G0: 0.0}), (6.0, holders, {G0: 50.0}), (8.0, holders, {G0: 0.0})])
    assert detector.low_since(G0) == 8.0
    feed(detector, [(12.0, holders, {G0: None})])  # unknown is not idle
    assert detector.low_since(G0) is None
    feed(detector, [(13.0, holders, {G0: 0.0})])
    restarted = Holder("job-a", "team-a", 1000, since=14.0)  # the same job, a new attempt
    assert feed(detector, [(20.0, {G0: [restarted]}, {G0: 0.0})]) == []
    assert detector.low_since(G0) == 20.0
    assert [f.since for f in feed(detector, [(30.0, {G0: [restarted]}, {G0: 0.0})])] == [14.0]


def test_a_gang_is_idle_only_when_all_its_gpus_are_and_work_clears_the_flag() -> None:
    detector = IdleDetector(threshold_pct=5.0, window_s=10.0)
    holders = {G0: [A], G1: [A]}
    ticks = [(t, holders, {G0: 0.0, G1: 90.0 if t < 20 else 0.0}) for t in range(0, 40, 5)]
    flags = feed(detector, ticks)
    assert [(f.flagged_at, f.idle_since, f.gpus) for f in flags] == [(30.0, 20.0, (G0, G1))]
    feed(detector, [(40.0, holders, {G0: 0.0, G1: 60.0})])
    assert detector.flagged_jobs() == {}


def test_a_job_already_being_stopped_is_not_flagged() -> None:
    detector = IdleDetector(threshold_pct=5.0, window_s=1.0)
    stopping = Holder("job-a", "team-a", 1000, since=0.0, stopping=True)
    assert feed(detector, [(t, {G0: [stopping]}, {G0: 0.0}) for t in (0.0, 1.0, 2.0)]) == []


def test_usage_is_split_by_share_and_idle_time_includes_the_window_that_led_to_the_flag() -> None:
    detector = IdleDetector(threshold_pct=5.0, window_s=10.0)
    half_a = Holder("job-a", "team-a", 500, since=0.0)
    half_c = Holder("job-c", "team-b", 250, since=0.0)
    holders = {G0: [half_a, half_c], G1: [B]}
    totals: dict[str, list[float]] = {}
    for t in range(0, 25, 5):
        result = detector.update(float(t), holders, {G0: 60.0, G1: 0.0})
        for job, (_queue, use) in result.usage.items():
            acc = totals.setdefault(job, [0.0, 0.0, 0.0])
            acc[0] += use.sampled
            acc[1] += use.used
            acc[2] += use.idle
    # 20 s of samples (the first tick has nothing before it). GPU 0 at 60 % is used by both jobs in
    # proportion to their shares (500:250), capped at each share; GPU 1 reads 0 % from t=0 and is flagged at
    # t=10 with its 10 s run, then counts 5 + 5 s more.
    assert totals["job-a"] == pytest.approx([0.5 * 20, 0.4 * 20, 0.0])
    assert totals["job-c"] == pytest.approx([0.25 * 20, 0.2 * 20, 0.0])
    assert totals["job-b"] == pytest.approx([20.0, 0.0, 20.0])


def test_bad_settings_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="idle threshold"):
        IdleDetector(threshold_pct=0.0)
    with pytest.raises(ValueError, match="idle window"):
        IdleDetector(window_s=-1.0)


@settings(max_examples=150, deadline=None)
@given(
    utils=st.lists(st.one_of(st.none(), st.floats(0, 100, allow_nan=False)), min_size=1, max_size=40),
    window=st.integers(1, 8),
    threshold=st.floats(0.5, 50),
)
def test_flag_matches_the_definition_and_idle_never_exceeds_sampled_time(
    utils: list[float | None], window: int, threshold: float
) -> None:
    """Against a direct reading of the definition: flagged at tick t iff every reading since some tick s,
    with t - s >= window, is known and under the threshold; and held-idle time <= sampled time."""
    detector = IdleDetector(threshold_pct=threshold, window_s=float(window))
    sampled = idle = 0.0
    for t, util in enumerate(utils):
        result = detector.update(float(t), {G2: [A]}, {G2: util})
        use = result.usage["job-a"][1]
        sampled += use.sampled
        idle += use.idle
        run = 0
        for earlier in reversed(utils[: t + 1]):
            if earlier is None or earlier >= threshold:
                break
            run += 1
        assert detector.gpu_flagged(G2) == (run >= 1 and run - 1 >= window)
        assert ("job-a" in detector.flagged_jobs()) == detector.gpu_flagged(G2)
        assert idle <= sampled + 1e-9
