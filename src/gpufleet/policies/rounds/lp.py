"""Max-min fair shares of GPU models over throughput-normalised allocations, as a linear program.

Gavel (Narayanan et al., OSDI 2020, §4.1-4.2) allocates each job `j` a fraction of time `x[j, m]` on each GPU
model `m` and maximises the smallest *normalised* throughput, weighted:

    maximise  t
    s.t.      t * w[j] <= sum_m T[j, m] * x[j, m] / E[j]        every job (its share of its entitlement)
              sum_m x[j, m] <= 1                                every job (one place at a time)
              sum_j g[j] * x[j, m] <= N[m]                      every model (its GPUs)
              x >= 0, x[j, m] = 0 where T[j, m] = 0

`T[j, m]`: the job's measured throughput on model m at its GPU count; `g[j]` its GPUs; `w[j]` its weight;
`E[j]` the throughput it would get from an equal share of the cluster, `sum_m T[j, m] * N[m] / N` (every
model for the same time, 1/n of the cluster each; Gavel's normalisation by the isolated share). With all
`T` equal, this is heterogeneity-agnostic max-min fairness (Gavel's `max_min_fairness`).

Two things keep it fast and well-posed at 1,000+ active jobs:

- Jobs with the same throughput row, GPU count and weight are one *class* with a count: the LP is convex and
  symmetric in the jobs of a class, so some optimum gives them equal shares, and the variables are per
  class (26 job types x 4 GPU counts x a few weights, whatever the number of jobs).
- A second LP (`efficient=True`) keeps every job at the max-min level `t*` and maximises what every queue
  gets, the same for each queue per unit of its weight (`group`, `group_weight`): max-min alone leaves GPUs
  idle whenever one bottleneck job fixes `t*` (Gavel's single LP may), and giving the rest to whoever gains
  most would break the queues' equal shares. With one queue it maximises the total normalised throughput.

The solver is HiGHS as `scipy.optimize.linprog(method="highs")` runs it (dual simplex), reached through scipy's
binding of HiGHS without linprog's post-processing (`_highs`), imported when first solving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.scheduling.plugin_api import FloatArray, IntArray

# The second stage keeps every class at (1 - SLACK) of the max-min level, so HiGHS' tolerances never make it
# infeasible.
SLACK = 1e-7


@dataclass(frozen=True, slots=True)
class Problem:
    """`throughput[C, M]` steps/s of a job of class c on model m at its GPU count (0: cannot run there),
    `gpus[C]` GPUs per job, `count[C]` jobs of the class, `weight[C]` > 0, `capacity[M]` GPUs per model."""

    throughput: FloatArray
    gpus: IntArray
    count: IntArray
    weight: FloatArray
    capacity: IntArray
    group: IntArray | None = None  # the queue (0..Q-1) of each class; None: one queue
    group_weight: FloatArray | None = None  # each queue's weight (default: equal)

    def __post_init__(self) -> None:
        c, m = self.throughput.shape if self.throughput.ndim == 2 else (-1, -1)
        problems = []
        if c < 0:
            problems.append(FieldProblem("throughput", "is not a classes x models matrix", "give a 2-D array"))
        elif not (np.isfinite(self.throughput).all() and (self.throughput >= 0).all()):
            problems.append(FieldProblem("throughput", "has negative or non-finite values", "give steps/s >= 0"))
        for name, array, size in (
            ("gpus", self.gpus, c),
            ("count", self.count, c),
            ("weight", self.weight, c),
            ("capacity", self.capacity, m),
        ):
            if array.shape != (size,):
                problems.append(FieldProblem(name, f"has shape {array.shape}", f"give {size} values"))
        if not problems:
            if (self.gpus < 1).any() or (self.count < 1).any():
                problems.append(FieldProblem("gpus/count", "has values below 1", "give >= 1 GPU and job per class"))
            if not (self.weight > 0).all():
                problems.append(FieldProblem("weight", "has values <= 0", "give weights > 0"))
            if (self.capacity < 0).any():
                problems.append(FieldProblem("capacity", "is negative", "give GPU counts >= 0"))
        check(problems, "allocation problem")


@dataclass(frozen=True, slots=True)
class Allocation:
    """`share[C, M]`: the fraction of time each job of class c should spend on model m (rows sum to <= 1);
    `level`: the max-min normalised throughput per unit of weight; `normalised[C]`: each class's normalised
    throughput (1.0 = what an equal share of the cluster gives it)."""

    share: FloatArray
    level: float
    normalised: FloatArray


def equal_share_throughput(problem: Problem) -> FloatArray:
    """`E[C]`: throughput on an equal share of every GPU of the cluster (the normalisation)."""
    total = float(problem.capacity.sum())
    if total <= 0:
        return np.zeros(len(problem.gpus), dtype=np.float64)
    return np.asarray(problem.throughput @ (problem.capacity / total), dtype=np.float64)


def _rows_then_last(row: IntArray, values: FloatArray, last: FloatArray, rows: int, last_column: int) -> Any:
    """A CSR matrix, `rows` x (`last_column` + 1): variable `v` (a column) in row `row[v]` with `values[v]`, and
    `last[r]` in column `last_column` of every row r. Built from its arrays directly (scipy's COO stacking
    costs as much as a solve at 1,000 jobs); the same matrix, in canonical form, as stacking would give."""
    from scipy.sparse import csr_array

    order = np.argsort(row, kind="stable")  # by row, then by variable
    per_row = np.bincount(row, minlength=rows)
    indptr = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(per_row + 1, out=indptr[1:])
    # Each row's variables, then its entry in the last column.
    position = np.arange(len(row)) + row[order]
    indices = np.empty(len(row) + rows, dtype=np.int32)
    data = np.empty(len(row) + rows, dtype=np.float64)
    indices[position] = order
    data[position] = values[order]
    ends = indptr[1:] - 1
    indices[ends] = last_column
    data[ends] = last
    return csr_array((data, indices, indptr), shape=(rows, last_column + 1))


def _inequalities(
    row: IntArray, model: IntArray, gain: FloatArray, weight: FloatArray, gpus: IntArray, models: int
) -> Any:
    """`A_ub` of the first stage, variables x then t: per live class, its fairness row (w * t - sum gain * x)
    and its one-place row (sum x); per model, its capacity row (sum count * gpus * x)."""
    from scipy.sparse import csr_array

    live, n = len(weight), len(row)
    fair = _rows_then_last(row, -gain, weight, live, n)
    by_model = np.argsort(model, kind="stable")
    place_ptr = np.zeros(live + 1, dtype=np.int32)
    np.cumsum(np.bincount(row, minlength=live), out=place_ptr[1:])
    capacity_ptr = np.zeros(models + 1, dtype=np.int32)
    np.cumsum(np.bincount(model, minlength=models), out=capacity_ptr[1:])
    indptr = np.concatenate([fair.indptr, fair.indptr[-1] + place_ptr[1:], fair.indptr[-1] + n + capacity_ptr[1:]])
    indices = np.concatenate([fair.indices, np.arange(n, dtype=np.int32), by_model.astype(np.int32)])
    data = np.concatenate([fair.data, np.ones(n), gpus[by_model].astype(np.float64)])
    return csr_array((data, indices, indptr.astype(np.int32)), shape=(2 * live + models, n + 1))


def _linprog(
    cost: FloatArray,
    a_ub: Any,
    b_ub: FloatArray,
    bounds: FloatArray,
    a_eq: Any = None,
    b_eq: FloatArray | None = None,
) -> FloatArray | None:
    """`scipy.optimize.linprog(method="highs")`'s solution x (None: not optimal), `bounds` an (n, 2) array."""
    result = _linprog_result(cost, a_ub, b_ub, bounds, a_eq, b_eq)
    return np.asarray(result.x, dtype=np.float64) if result.status == 0 else None


def _linprog_result(
    cost: FloatArray, a_ub: Any, b_ub: FloatArray, bounds: FloatArray, a_eq: Any, b_eq: FloatArray | None
) -> Any:
    from scipy.optimize import linprog  # a well-kept LP solver (HiGHS); loaded on first use

    return linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")


def _highs(
    cost: FloatArray,
    a_ub: Any,
    b_ub: FloatArray,
    bounds: FloatArray,
    a_eq: Any = None,
    b_eq: FloatArray | None = None,
) -> FloatArray | None:
    """What `_linprog` returns, from the same HiGHS model and options that `linprog(method="highs")` passes
    (dual simplex, presolve on), without linprog's post-processing: it computes the dual marginals of every
    column in a Python loop and checks its options one by one, a third of the LP's CPU at 1,000 jobs. HiGHS is
    reached through scipy's bundled binding; where that differs from what this reads, `_linprog` is used."""
    try:
        from scipy.optimize._highspy import _core as highs_core  # the binding linprog itself calls
        from scipy.sparse import csc_array, vstack

        lp = highs_core.HighsLp()
        options = highs_core.HighsOptions()
        solver = highs_core._Highs()
        optimal = highs_core.HighsModelStatus.kOptimal
        dual_simplex = highs_core.simplex_constants.SimplexStrategy.kSimplexStrategyDual
        infinity = highs_core.kHighsInf
        colwise = highs_core.MatrixFormat.kColwise
    except (ImportError, AttributeError):
        return _linprog(cost, a_ub, b_ub, bounds, a_eq, b_eq)
    matrix = csc_array(a_ub if a_eq is None else vstack((a_ub, a_eq)))
    equal = np.zeros(0) if b_eq is None else np.asarray(b_eq, dtype=np.float64)
    lp.num_col_ = matrix.shape[1]
    lp.num_row_ = matrix.shape[0]
    lp.a_matrix_.num_col_ = matrix.shape[1]
    lp.a_matrix_.num_row_ = matrix.shape[0]
    lp.a_matrix_.format_ = colwise
    lp.col_cost_ = np.asarray(cost, dtype=np.float64)
    lower, upper = bounds.T.copy()
    for limits in (lower, upper):
        unbounded = np.isinf(limits)
        limits[unbounded] = np.sign(limits[unbounded]) * infinity  # HiGHS' infinity
    lp.col_lower_ = lower
    lp.col_upper_ = upper
    lp.row_lower_ = np.concatenate((np.full(len(b_ub), -infinity), equal))
    lp.row_upper_ = np.concatenate((np.asarray(b_ub, dtype=np.float64), equal))
    lp.a_matrix_.start_ = matrix.indptr
    lp.a_matrix_.index_ = matrix.indices
    lp.a_matrix_.value_ = matrix.data
    options.presolve = "on"
    options.log_to_console = False
    options.output_flag = False
    options.simplex_strategy = dual_simplex
    if solver.passOptions(options) == highs_core.HighsStatus.kError:
        return _linprog(cost, a_ub, b_ub, bounds, a_eq, b_eq)
    if solver.passModel(lp) == highs_core.HighsStatus.kError:
        return None
    if solver.run() == highs_core.HighsStatus.kError or solver.getModelStatus() != optimal:
        return None
    return np.array(solver.getSolution().col_value, dtype=np.float64)


def solve(problem: Problem, *, efficient: bool = True) -> Allocation:
    """The max-min fair allocation of `problem` (see the module docstring)."""
    from scipy.sparse import csr_array

    classes, models = problem.throughput.shape
    runnable = problem.throughput > 0
    entitled = equal_share_throughput(problem)
    active = runnable.any(axis=1) & (entitled > 0)
    share = np.zeros((classes, models), dtype=np.float64)
    if not active.any() or problem.capacity.sum() == 0:
        return Allocation(share, 0.0, np.zeros(classes, dtype=np.float64))

    rows_c, cols_m = np.nonzero(runnable & active[:, None])
    n = len(rows_c)  # variables x[c, m] where the class runs, then t
    gain = problem.throughput[rows_c, cols_m] / entitled[rows_c]
    live = np.flatnonzero(active)
    live_index = np.full(classes, -1, dtype=np.int64)
    live_index[live] = np.arange(len(live))
    a_ub = _inequalities(
        live_index[rows_c], cols_m, gain, problem.weight[live], (problem.count * problem.gpus)[rows_c], models
    )
    b_ub = np.concatenate([np.zeros(len(live)), np.ones(len(live)), problem.capacity.astype(np.float64)])
    cost = np.zeros(n + 1)
    cost[n] = -1.0
    bounds = np.zeros((n + 2, 2))
    bounds[:, 1] = np.inf
    first = _highs(cost, a_ub, b_ub, bounds[: n + 1])
    if first is None:
        why = _linprog_result(cost, a_ub, b_ub, bounds[: n + 1], None, None).message
        raise ArithmeticError(f"the max-min LP did not solve: {why}")
    level = float(first[n])
    x = first[:n]
    if efficient and level > 0:
        # Keep every class at the max-min level; maximise Z, each queue's normalised throughput over its weight,
        # equal for every queue (with one queue: the total). Variables: x, t (fixed at the level), Z.
        floor = level * (1.0 - SLACK)
        groups = problem.group if problem.group is not None else np.zeros(classes, dtype=np.int64)
        count_groups = int(groups.max()) + 1
        group_weight = (
            problem.group_weight if problem.group_weight is not None else np.ones(count_groups, dtype=np.float64)
        )
        live_groups = np.unique(groups[rows_c])
        g_index = np.full(count_groups, -1, dtype=np.int64)
        g_index[live_groups] = np.arange(len(live_groups))
        # sum_{c in q} count * gain * x - Z * W_q = 0
        balance = _rows_then_last(
            g_index[groups[rows_c]], gain * problem.count[rows_c], -group_weight[live_groups], len(live_groups), n + 1
        )
        a_ub2 = csr_array((a_ub.data, a_ub.indices, a_ub.indptr), shape=(a_ub.shape[0], n + 2))
        bounds[n] = floor
        objective = np.zeros(n + 2)
        objective[n + 1] = -1.0
        second = _highs(objective, a_ub2, b_ub, bounds, balance, np.zeros(len(live_groups)))
        if second is not None:
            x = second[:n]
    share[rows_c, cols_m] = np.clip(x, 0.0, 1.0)
    normalised = np.zeros(classes, dtype=np.float64)
    np.add.at(normalised, rows_c, gain * share[rows_c, cols_m])
    return Allocation(share, level, normalised)
