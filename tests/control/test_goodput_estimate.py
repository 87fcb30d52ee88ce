"""Goodput estimated from progress reports: the throughput fit, the efficiency from gradient statistics, the
loss-descent factor, and what the resize policy does with them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.control.goodput import (
    PRIOR_SYNC,
    efficiency,
    goodput_by_size,
    still_learning,
    throughput,
    throughput_model,
)
from gpufleet.domain.progress import JobProgress, SizeThroughput
from gpufleet.policies.resize.goodput import GoodputResize
from gpufleet.scheduling.plugin_api import ElasticJob, ResizeInput


def measured(a: float, b: float, sizes: tuple[int, ...]) -> JobProgress:
    """A job that ran at `sizes` with throughput exactly g / (a + b (g - 1)), 100 s at each."""
    return JobProgress(throughput=tuple(SizeThroughput(g, 100.0 * g / (a + b * (g - 1)), 100.0, 10) for g in sizes))


@settings(max_examples=50, deadline=None)
@given(a=st.floats(1e-4, 1.0), share=st.floats(0.0, 0.5))
def test_the_fit_recovers_the_model_from_two_or_more_sizes(a: float, share: float) -> None:
    fitted = throughput_model(measured(a, a * share, (1, 2, 4, 8)))
    assert fitted[0] == pytest.approx(a, rel=1e-6)
    assert fitted[1] == pytest.approx(a * share, rel=1e-6, abs=1e-9 * a)


def test_one_size_measured_is_matched_there_and_scaled_by_the_prior_elsewhere() -> None:
    progress = JobProgress(throughput=(SizeThroughput(4, 400.0, 10.0, 5),))
    model = throughput_model(progress)
    assert throughput(model, 4) == pytest.approx(40.0)
    assert model[1] == pytest.approx(PRIOR_SYNC * model[0])
    assert 40.0 < throughput(model, 8) < 80.0  # more, but less than linear


def test_without_reports_the_prior_is_sublinear_and_increasing() -> None:
    model = throughput_model(None)
    rates = [throughput(model, g) for g in (1, 2, 4, 8, 16)]
    assert rates == sorted(rates)
    assert rates[-1] < 16 * rates[0]


def test_noisy_gradients_make_large_batches_efficient_and_clean_ones_do_not() -> None:
    noisy = JobProgress(grad_sqr=1.0, grad_var=1000.0)
    clean = JobProgress(grad_sqr=1.0, grad_var=0.001)
    assert efficiency(noisy, 4.0) > 0.99
    assert efficiency(clean, 4.0) == pytest.approx(0.25, rel=1e-2)
    assert efficiency(None, 4.0) == 1.0
    assert efficiency(clean, 1.0) == pytest.approx(1.0)


def curve(losses: list[float]) -> JobProgress:
    return JobProgress(loss_curve=tuple((float(i * 100), loss) for i, loss in enumerate(losses)))


def test_a_flattened_loss_counts_for_nothing_and_a_falling_one_for_all() -> None:
    assert still_learning(curve([10.0 - i for i in range(16)])) == pytest.approx(1.0)
    assert still_learning(curve([10.0 * math.exp(-i) for i in range(16)])) < 0.01
    assert still_learning(curve([5.0] * 16)) == 1.0  # never fell: it cannot tell
    assert still_learning(curve([3.0, 2.0])) == 1.0  # too short to tell


def test_the_policy_gives_idle_gpus_to_the_job_still_learning() -> None:
    learning = curve([10.0 - 0.5 * i for i in range(16)])
    flattened = curve([10.0 * math.exp(-i) for i in range(16)])
    jobs = tuple(
        ElasticJob(name, "a", 2, 1, 8, 1, goodput_by_size(progress, 2, range(1, 9)))
        for name, progress in (("learning", learning), ("flattened", flattened))
    )
    new = GoodputResize().resize(ResizeInput(0.0, 4, jobs, {}))
    assert new == {"learning": 6}
    # And to admit a waiting job, the flattened one gives back first.
    new = GoodputResize().resize(ResizeInput(0.0, 0, jobs, {}, waiting=(("b", 1),)))
    assert new == {"flattened": 1}
