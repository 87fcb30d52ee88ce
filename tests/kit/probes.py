"""Call one plugin the way the core does, on the working state built from a snapshot.

For plugin table tests: what a filter says per node, what a score gives per node, which GPUs the
selector picks. The state is the core's own `CycleState`, built from a real snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from gpufleet.domain import ClusterSnapshot, Job
from gpufleet.policies.catalog import build_profile
from gpufleet.scheduling.placer import full_evaluation, run_filters
from gpufleet.scheduling.plugin_api import ALL_ROWS, FilterPlugin, GangContext, JobView, ScorePlugin, SelectPlugin
from gpufleet.scheduling.state import CycleState

# The standard filters and nothing else: scores and selectors are probed on what they let through.
FILTERS_ONLY = build_profile("probe", "fifo", ())


def view_of(job: Job, state: CycleState, allowed_models: Iterable[str] | None = None) -> JobView:
    """The job's view; `allowed_models` narrows it as quota admission would."""
    lut = state.table.model_lut(job.request.models)
    if allowed_models is not None:
        keep = set(allowed_models)
        for i, model in enumerate(state.table.models):
            lut[i] = lut[i] and model in keep
    return JobView(job, lut)


def filter_verdicts(
    plugin: FilterPlugin, snapshot: ClusterSnapshot, job: Job, allowed_models: Iterable[str] | None = None
) -> dict[str, str | None]:
    """Per node: the first reason it fails this filter for, or None if it passes."""
    state = CycleState(snapshot)
    usable = state.table.gpu_exists.copy()
    result = plugin.filter(view_of(job, state, allowed_models), state.view, usable, ALL_ROWS)
    verdicts: dict[str, str | None] = {}
    for i, name in enumerate(state.table.names):
        verdicts[name] = next((reason for reason, mask in result.checks if not mask[i]), None)
    return verdicts


def usable_gpus(snapshot: ClusterSnapshot, job: Job) -> dict[str, tuple[int, ...]]:
    """Per node passing the standard filters: the GPU indices a worker of `job` could take."""
    state = CycleState(snapshot)
    usable, passed, _ = run_filters(FILTERS_ONLY, view_of(job, state), state)
    return {state.table.names[i]: tuple(int(g) for g in np.flatnonzero(usable[i])) for i in np.flatnonzero(passed)}


def score_nodes(
    plugin: ScorePlugin, snapshot: ClusterSnapshot, job: Job, gang_nodes: Sequence[str] = ()
) -> dict[str, float]:
    """Scores of the nodes that pass the standard filters; `gang_nodes`: where earlier workers went."""
    state = CycleState(snapshot)
    view = view_of(job, state)
    evaluation = full_evaluation(FILTERS_ONLY, view, state)
    candidates = np.flatnonzero(evaluation.passed)
    gang = GangContext([state.table.index[n] for n in gang_nodes])
    scores = plugin.score(view, state.view, evaluation, candidates, gang)
    assert scores.shape == candidates.shape
    return {state.table.names[int(i)]: round(float(s), 6) for i, s in zip(candidates, scores, strict=True)}


def select_gpus(plugin: SelectPlugin, snapshot: ClusterSnapshot, job: Job, node: str) -> tuple[int, ...]:
    """The GPUs the selector picks on `node` among those the standard filters leave usable."""
    state = CycleState(snapshot)
    view = view_of(job, state)
    usable, passed, _ = run_filters(FILTERS_ONLY, view, state)
    i = state.table.index[node]
    assert passed[i], f"{node} does not pass the filters for {job.id}"
    return plugin.select(view, state.table, i, usable[i])


def fingerprint(state: CycleState) -> tuple[bytes, ...]:
    """The free-resource arrays, quota usage and removed jobs as bytes: equal before and after a what-if means
    the state was restored exactly."""
    t = state.table
    usage = sorted((q, sorted((k, v) for k, v in u.items() if v)) for q, u in state.ledger.usage.items())
    arrays = (t.gpu_milli_free, t.gpu_mem_free, t.cpu_free, t.mem_free)
    return (*(a.tobytes() for a in arrays), repr(usage).encode(), repr(sorted(state.removed)).encode())
