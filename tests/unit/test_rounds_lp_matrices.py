"""The round allocator's LP is built from arrays directly: the solver gets exactly the matrices that stacking
scipy's COO blocks gives (the construction it replaced, kept here as the reference), and HiGHS, reached through
scipy's binding, returns exactly what `linprog` returns for them, so allocations are the same."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.optimize
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse import coo_array, hstack, vstack

from gpufleet.policies.rounds import lp
from gpufleet.policies.rounds.lp import Problem, equal_share_throughput, solve


def reference(problem: Problem) -> tuple[Any, Any]:
    """A_ub of the first stage and A_eq of the second, as COO blocks stacked."""
    classes, models = problem.throughput.shape
    runnable = problem.throughput > 0
    entitled = equal_share_throughput(problem)
    active = runnable.any(axis=1) & (entitled > 0)
    rows_c, cols_m = np.nonzero(runnable & active[:, None])
    n = len(rows_c)
    gain = problem.throughput[rows_c, cols_m] / entitled[rows_c]
    live = np.flatnonzero(active)
    live_index = np.full(classes, -1, dtype=np.int64)
    live_index[live] = np.arange(len(live))
    var = np.arange(n)
    fair = coo_array(
        (
            np.concatenate([-gain, problem.weight[live]]),
            (np.concatenate([live_index[rows_c], np.arange(len(live))]), np.concatenate([var, np.full(len(live), n)])),
        ),
        shape=(len(live), n + 1),
    )
    place = coo_array((np.ones(n), (live_index[rows_c], var)), shape=(len(live), n + 1))
    capacity = coo_array(
        ((problem.count * problem.gpus)[rows_c].astype(np.float64), (cols_m, var)), shape=(models, n + 1)
    )
    a_ub = vstack([fair, place, capacity]).tocsr()
    groups = problem.group if problem.group is not None else np.zeros(classes, dtype=np.int64)
    count_groups = int(groups.max()) + 1
    group_weight = problem.group_weight if problem.group_weight is not None else np.ones(count_groups)
    live_groups = np.unique(groups[rows_c])
    g_index = np.full(count_groups, -1, dtype=np.int64)
    g_index[live_groups] = np.arange(len(live_groups))
    balance = coo_array(
        (
            np.concatenate([gain * problem.count[rows_c], -group_weight[live_groups]]),
            (
                np.concatenate([g_index[groups[rows_c]], np.arange(len(live_groups))]),
                np.concatenate([var, np.full(len(live_groups), n + 1)]),
            ),
        ),
        shape=(len(live_groups), n + 2),
    )
    return hstack([a_ub, coo_array((a_ub.shape[0], 1))]).tocsr(), balance.tocsr()


def same(given_matrix: Any, expected: Any) -> None:
    given_matrix, expected = given_matrix.tocsr(), expected.tocsr()
    assert given_matrix.shape == expected.shape
    assert given_matrix.indptr.tolist() == expected.indptr.tolist()
    assert given_matrix.indices.tolist() == expected.indices.tolist()
    assert given_matrix.data.tolist() == expected.data.tolist()  # exactly: the same floats


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    classes = draw(st.integers(1, 14))
    models = draw(st.integers(1, 4))
    speeds = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 8.0])
    throughput = draw(st.lists(st.lists(speeds, min_size=models, max_size=models), min_size=classes, max_size=classes))
    queues = draw(st.integers(1, 3))
    return Problem(
        np.array(throughput, dtype=np.float64),
        np.array(draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=classes, max_size=classes)), dtype=np.int64),
        np.array(draw(st.lists(st.integers(1, 40), min_size=classes, max_size=classes)), dtype=np.int64),
        np.array(draw(st.lists(st.sampled_from([0.5, 1.0, 4.0]), min_size=classes, max_size=classes))),
        np.array(draw(st.lists(st.integers(0, 64), min_size=models, max_size=models)), dtype=np.int64),
        np.array(draw(st.lists(st.integers(0, queues - 1), min_size=classes, max_size=classes)), dtype=np.int64),
        np.array(draw(st.lists(st.sampled_from([1.0, 2.0]), min_size=queues, max_size=queues))),
    )


def solver_calls(p: Problem) -> tuple[list[tuple[Any, ...]], Any]:
    """The arguments of every HiGHS call `solve(p)` makes, and its allocation."""
    calls: list[tuple[Any, ...]] = []
    real = lp._highs

    def spy(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lp, "_highs", spy)
        result = solve(p)
    return calls, result


@settings(max_examples=80, deadline=None)
@given(problems())
def test_the_solver_gets_the_stacked_matrices(p: Problem) -> None:
    calls, result = solver_calls(p)
    if not calls:  # nothing can run, or no GPUs: no LP
        assert not result.share.any()
        return
    a_ub, balance = reference(p)
    same(calls[0][1], a_ub[:, :-1])
    if len(calls) > 1:  # the second stage (the level was above 0)
        same(calls[1][1], a_ub)
        same(calls[1][4], balance)


@settings(max_examples=80, deadline=None)
@given(problems())
def test_highs_through_its_binding_solves_exactly_as_linprog(p: Problem) -> None:
    """`_highs` passes HiGHS the model and options `linprog(method="highs")` passes, so both stages give the very
    same solution (bit for bit), and it never falls back to linprog with the scipy this project installs."""
    calls, _ = solver_calls(p)
    for args in calls:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(scipy.optimize, "linprog", None)  # the binding alone
            direct = lp._highs(*args)
        through_linprog = lp._linprog(*args)
        assert (direct is None) == (through_linprog is None)
        if direct is not None and through_linprog is not None:
            assert direct.tolist() == through_linprog.tolist()
