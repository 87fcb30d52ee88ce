"""Placing one job on the working state: filters, scores and GPU selection per worker, gangs all-or-nothing."""

from __future__ import annotations

import numpy as np

from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.scheduling.classes import filter_class
from gpufleet.scheduling.comm_gate import gate, within_limit
from gpufleet.scheduling.plugin_api import FilterResult, GangContext, JobView, Profile
from gpufleet.scheduling.state import CycleState, Evaluation
from gpufleet.scheduling.status import Code, Status, unschedulable
from gpufleet.scheduling.table import ALL_ROWS, BoolArray, FloatArray, IntArray, Rows, rows_count

PLUGIN = "placement"


def explain_nodes(total: int, results: list[FilterResult]) -> str:
    """`0/1000 nodes fit: 700 too few free GPUs, 300 wrong GPU model` (first failing check per node)."""
    undecided = np.ones(total, dtype=np.bool_)
    counts: dict[str, int] = {}
    for result in results:
        for reason, passed in result.checks:
            failing = undecided & ~passed
            n = int(failing.sum())
            if n:
                counts[reason] = counts.get(reason, 0) + n
                undecided &= passed
    fitting = int(undecided.sum())
    listed = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{fitting}/{total} nodes fit" + (f": {listed}" if listed else "")


def run_filters(
    profile: Profile, view: JobView, state: CycleState, rows: Rows = ALL_ROWS
) -> tuple[BoolArray, BoolArray, list[FilterResult]]:
    """Run every filter on `rows`: the GPUs usable there, the rows that pass, and the checks."""
    table = state.table
    usable = table.gpu_exists[rows]
    if isinstance(rows, slice):
        usable = usable.copy()  # an index array gives a copy already
    passed = np.ones(len(usable), dtype=np.bool_)
    results: list[FilterResult] = []
    for plugin in profile.filters:
        result = plugin.filter(view, state.view, usable, rows)
        results.append(result)
        for _, mask in result.checks:
            np.logical_and(passed, mask, out=passed)
    return usable, passed, results


def largest_group(state: CycleState, usable: BoolArray, rows: Rows) -> IntArray:
    """Per row: the most usable GPUs inside one NVLink group of the node."""
    table = state.table
    if table.nvlink_groups == 1:
        return rows_count(usable)
    if table.nvlink_block:
        per_group = np.add.reduce(
            usable.reshape(len(usable), table.nvlink_groups, table.nvlink_block), axis=2, dtype=np.int64
        )
        result: IntArray = np.maximum.reduce(per_group, axis=1)
        return result
    best: IntArray | None = None
    for mask in table.nvlink_masks:
        count = rows_count(usable & mask[rows])
        best = count if best is None else np.maximum(best, count, out=best)
    assert best is not None
    return best


def full_evaluation(profile: Profile, view: JobView, state: CycleState) -> Evaluation:
    """Every filter on every node, uncached."""
    usable, passed, _ = run_filters(profile, view, state)
    return Evaluation(usable, passed, largest_group(state, usable, ALL_ROWS), state.table.clock)


def evaluate(profile: Profile, view: JobView, state: CycleState) -> Evaluation:
    """Filter results for this job's request class.

    Jobs with the same request and allowed models share one evaluation (an equivalence class, as in
    kube-scheduler); after a change only the changed nodes are filtered again. The arrays returned
    belong to the cache: read them, never write them.
    """
    table = state.table
    key = filter_class(view.job, view.model_lut.tobytes())
    entry = state.evaluation(key)
    if entry is None:
        entry = full_evaluation(profile, view, state)
        state.evaluations[key] = entry
        return entry
    if entry.clock != table.clock:
        dirty = (table.version > entry.clock).nonzero()[0]
        if len(dirty):
            usable, passed, _ = run_filters(profile, view, state, dirty)
            entry.usable[dirty] = usable
            entry.passed[dirty] = passed
            entry.largest_group[dirty] = largest_group(state, usable, dirty)
        entry.clock = table.clock
    return entry


def choose_node(profile: Profile, view: JobView, state: CycleState, evaluation: Evaluation, gang: GangContext) -> int:
    if not profile.scores:
        return int(evaluation.passed.argmax())  # the first passing node
    if view.job.gang_size == 1 and not gang.nodes and profile.local_scores:
        return _choose_kept(profile, view, state, evaluation, gang)
    candidates: IntArray = evaluation.passed.nonzero()[0]
    if len(candidates) == 1:
        return int(candidates[0])
    total = _weighted(profile, view, state, evaluation, candidates, gang)
    # argmax returns the first maximum: the lowest node index, so ties break by node name.
    return int(candidates[int(total.argmax())])


def _weighted(
    profile: Profile, view: JobView, state: CycleState, evaluation: Evaluation, rows: IntArray, gang: GangContext
) -> FloatArray:
    total: FloatArray | None = None
    for plugin, weight in profile.scores:
        weighted = weight * plugin.score(view, state.view, evaluation, rows, gang)
        # The first term as is: 0.0 + x is x (or +0.0 for -0.0, which compares equal), same argmax.
        total = weighted if total is None else np.add(total, weighted, out=total)
    assert total is not None
    return total


def _choose_kept(profile: Profile, view: JobView, state: CycleState, evaluation: Evaluation, gang: GangContext) -> int:
    """`choose_node` from the class's kept scores, recomputed for the passing nodes that changed since.

    Node-local scores of a node are elementwise functions of its rows, so a score computed for some rows
    equals the one computed for all candidates: the choice is the one a full computation makes, at the
    cost of the nodes that changed (a few per placement) instead of every candidate."""
    table = state.table
    scores = evaluation.scores
    if scores is None:
        scores = evaluation.scores = np.full(len(table), -np.inf, dtype=np.float64)
        stale: IntArray = evaluation.passed.nonzero()[0]
    elif evaluation.scores_clock != table.clock:
        changed = (table.version > evaluation.scores_clock).nonzero()[0]
        passing = evaluation.passed[changed]
        scores[changed[~passing]] = -np.inf  # nodes that stopped passing drop out of the argmax
        stale = changed[passing]
    else:
        stale = np.zeros(0, dtype=np.int64)
    if len(stale):
        scores[stale] = _weighted(profile, view, state, evaluation, stale, gang)
    evaluation.scores_clock = table.clock
    # -inf exactly where a node does not pass; argmax: the lowest index on ties.
    return int(scores.argmax())


def make_worker(view: JobView, state: CycleState, node: int, gpus: tuple[int, ...]) -> WorkerPlacement:
    request = view.job.request
    table = state.table
    if request.fractional:
        shares = tuple(GpuShare(g, request.gpu_milli, request.gpu_memory) for g in gpus)
    else:
        memory = table.gpu_mem_total_rows[node]
        shares = tuple(GpuShare(g, 1000, memory[g]) for g in gpus)
    return WorkerPlacement(table.names[node], shares, request.cpu_milli, request.memory)


def place_worker(
    profile: Profile, view: JobView, state: CycleState, gang: GangContext, only: BoolArray | None = None
) -> WorkerPlacement | Status:
    """Place one worker and apply it to the table, or say why no node fits (`only`: on these nodes alone)."""
    evaluation = evaluate(profile, view, state)
    if only is not None:  # a private evaluation: the class's cached one (and its kept scores) stay as they are
        evaluation = Evaluation(evaluation.usable, evaluation.passed & only, evaluation.largest_group, evaluation.clock)
    if not evaluation.passed.any():
        _, _, results = run_filters(profile, view, state)
        return unschedulable(PLUGIN, explain_nodes(len(state.table), results))
    node = choose_node(profile, view, state, evaluation, gang)
    usable = evaluation.usable[node]
    gpus = profile.select.select(view, state.table, node, usable) if view.job.request.gpus else ()
    worker = make_worker(view, state, node, gpus)
    state.table.apply(worker, -1)
    gang.nodes.append(node)
    return worker


def place_gang(profile: Profile, view: JobView, state: CycleState, size: int) -> tuple[WorkerPlacement, ...] | Status:
    """Place `size` workers all-or-nothing; on failure the table is exactly as before.

    A job with a `max_comm_overhead` is not placed where its predicted all-reduce share passes it (`comm_gate`):
    when the profile's pick does, the gang is tried once more on the nodes that could carry its ring within the
    limit (`comm_gate.within_limit`); if that fails too, the job waits with the first pick's estimate."""
    placed = _place_workers(profile, view, state, size, None)
    comm = view.job.comm
    if isinstance(placed, Status) or comm is None or comm.max_overhead is None:
        return placed
    refused = gate(comm, state.table, placed)
    if refused is None:
        return placed
    state.table.apply_many(placed, +1)
    evaluation = evaluate(profile, view, state)
    only = within_limit(comm, state.table, evaluation.usable, evaluation.largest_group, size, view.job.request.gpus)
    if only.any():
        again = _place_workers(profile, view, state, size, only)
        if not isinstance(again, Status):
            if gate(comm, state.table, again) is None:
                return again
            state.table.apply_many(again, +1)
    return refused


def _place_workers(
    profile: Profile, view: JobView, state: CycleState, size: int, only: BoolArray | None
) -> tuple[WorkerPlacement, ...] | Status:
    gang = GangContext()
    placed: list[WorkerPlacement] = []
    for k in range(size):
        outcome = place_worker(profile, view, state, gang, only)
        if isinstance(outcome, Status):
            for worker in placed:
                state.table.apply(worker, +1)
            if size == 1:
                return outcome
            return Status(
                Code.UNSCHEDULABLE,
                (f"gang of {size} workers: only {k} fit together; worker {k + 1}: {outcome.message()}",),
                PLUGIN,
            )
        placed.append(outcome)
    return tuple(placed)


def fits(profile: Profile, view: JobView, state: CycleState, size: int) -> bool:
    """Whether `size` workers of the job would be placed now (what `place_gang` would say), the table
    left as it was: a trial placement, undone, unless `known_gang_fit` already knows the answer."""
    known = known_gang_fit(profile, view, state, size)
    if known is not None:
        return known
    outcome = place_gang(profile, view, state, size)
    if isinstance(outcome, Status):
        return False
    state.table.apply_many(outcome, +1)
    return True


def known_gang_fit(profile: Profile, view: JobView, state: CycleState, size: int) -> bool | None:
    """Whether `place_gang` would place the gang, where that is known without placing it; else None.

    Known when the request is whole GPUs and no passing node has usable free GPUs for a second worker:
    placing a worker then changes its own node only (filters are per node: class evaluations re-filter
    just the changed nodes), that node cannot pass again, and every other passing node still passes; so
    `place_gang` places all workers exactly when at least `size` nodes pass, wherever its scores put them."""
    request = view.job.request
    if size < 2 or not request.gpus or request.fractional:
        return None
    if view.job.comm is not None and view.job.comm.max_overhead is not None:
        return None  # where the workers land decides whether the gang is taken
    evaluation = evaluate(profile, view, state)
    passing = evaluation.passed.nonzero()[0]
    if len(passing) and int(rows_count(evaluation.usable[passing]).max()) >= 2 * request.gpus:
        return None
    return len(passing) >= size
