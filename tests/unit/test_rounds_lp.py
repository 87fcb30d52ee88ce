"""The round allocator's LP: max-min fair shares of GPU models over throughput-normalised allocations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.errors import SpecError
from gpufleet.policies.rounds.lp import Problem, equal_share_throughput, solve


def problem(throughput, gpus=None, count=None, weight=None, capacity=(4, 4)) -> Problem:
    t = np.array(throughput, dtype=np.float64)
    c = len(t)
    return Problem(
        t,
        np.array(gpus or [1] * c, dtype=np.int64),
        np.array(count or [1] * c, dtype=np.int64),
        np.array(weight or [1.0] * c, dtype=np.float64),
        np.array(capacity, dtype=np.int64),
    )


def test_each_job_goes_where_it_gains_most() -> None:
    # Gavel's example: job 0 is 4x faster on the fast model, job 1 only 1.2x; one GPU of each.
    result = solve(problem([[4.0, 1.0], [1.2, 1.0]], capacity=(1, 1)))
    assert result.share[0, 0] > 0.5 > result.share[1, 0]
    # Both end at least at their equal share of the cluster (normalised 1.0), the fast job above it.
    assert result.normalised.min() >= 1.0 - 1e-6


def test_agnostic_identical_jobs_share_equally_and_fill_the_cluster() -> None:
    result = solve(problem([[1.0, 1.0]], count=[16], capacity=(4, 4)))
    assert result.share[0].sum() == pytest.approx(0.5)  # 8 GPUs for 16 jobs: half the time each
    assert result.level == pytest.approx(0.5)


def test_weights_divide_the_level() -> None:
    result = solve(problem([[1.0, 1.0], [1.0, 1.0]], count=[4, 4], weight=[2.0, 1.0], capacity=(2, 2)))
    assert result.normalised[0] == pytest.approx(2 * result.normalised[1], rel=1e-6)


def test_a_job_that_cannot_run_anywhere_gets_nothing() -> None:
    result = solve(problem([[0.0, 0.0], [1.0, 2.0]], capacity=(1, 1)))
    assert result.share[0].sum() == 0.0
    assert result.share[1].sum() > 0.0


def test_bad_problems_are_refused_with_the_field() -> None:
    with pytest.raises(SpecError, match="weight"):
        problem([[1.0, 1.0]], weight=[0.0])
    with pytest.raises(SpecError, match="capacity"):
        problem([[1.0, 1.0]], capacity=(1,))


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    classes = draw(st.integers(1, 12))
    models = draw(st.integers(1, 3))
    throughput = draw(
        st.lists(
            st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 8.0]), min_size=models, max_size=models),
            min_size=classes,
            max_size=classes,
        )
    )
    gpus = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=classes, max_size=classes))
    count = draw(st.lists(st.integers(1, 40), min_size=classes, max_size=classes))
    weight = draw(st.lists(st.sampled_from([0.5, 1.0, 4.0]), min_size=classes, max_size=classes))
    capacity = draw(st.lists(st.integers(0, 64), min_size=models, max_size=models))
    return problem(throughput, gpus, count, weight, tuple(capacity))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_shares_are_feasible_and_max_min_holds(p: Problem) -> None:
    result = solve(p)
    share = result.share
    assert (share >= 0).all()
    assert (share.sum(axis=1) <= 1 + 1e-6).all()
    used = (p.count * p.gpus) @ share
    assert (used <= p.capacity + 1e-6).all()
    assert (share[p.throughput == 0] == 0).all()
    entitled = equal_share_throughput(p)
    runs = (p.throughput > 0).any(axis=1) & (entitled > 0)
    # Every job that can run gets at least the max-min level (times its weight), and the level is at least
    # what scaling every job's equal share down until the cluster fits would give.
    assert (result.normalised[runs] >= result.level * p.weight[runs] * (1 - 1e-5) - 1e-9).all()
    one_stage = solve(p, efficient=False)
    assert result.level == pytest.approx(one_stage.level, rel=1e-5, abs=1e-9)
    total = lambda r: float((r.normalised * p.count).sum())  # noqa: E731
    assert total(result) >= total(one_stage) * (1 - 1e-5) - 1e-9
