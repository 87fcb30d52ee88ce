"""Victim searches sort their candidates by the cycle's integer ranks (`_Ranks`) instead of by (cost, id) tuples:
the same order, whatever the costs (ties included), the batches they were ranked in and the subset a search
sorts; and on random worlds, the ranks successive searches of a cycle build order their candidates as (cost, id)
does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.jobs import Job, RunningJob
from gpufleet.domain.resources import WorkerRequest
from gpufleet.policies.catalog import profile
from gpufleet.policies.preempt import priority as priority_preemption
from gpufleet.scheduling.plugin_api import ClusterView, Holding
from gpufleet.scheduling.state import CycleState
from tests.property.strategies import World, worlds

COSTS = st.tuples(st.sampled_from((-1.0, 0.0, 2.5)), st.sampled_from((0.0, 1.0, 1e9)), st.integers(-3, 3).map(float))


def _holding(job_id: str) -> Holding:
    job = Job(job_id, "q", WorkerRequest(gpus=1))
    return Holding(job, (), (), RunningJob(job, ()))


@given(
    st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), COSTS, min_size=1, max_size=30),
    st.data(),
)
def test_ranks_sort_as_cost_and_id_tuples(costs: dict[str, tuple[float, ...]], data: st.DataObject) -> None:
    """Ranked in random batches (each ranks anew), every subset sorts as sorting by (cost, id) does."""
    ranks = priority_preemption._Ranks()
    ids = sorted(costs)
    cluster = ClusterView.__new__(ClusterView)  # the cost below reads nothing of it

    def cost(holding: Holding, _: ClusterView) -> tuple[float, ...]:
        return costs[holding.job.id]

    unranked = list(ids)
    while unranked:
        batch = data.draw(st.lists(st.sampled_from(unranked), unique=True, min_size=1))
        ranks.add([_holding(j) for j in batch], cost, cluster)
        unranked = [j for j in unranked if j not in batch]
        ranked = sorted(ranks.rank)
        subset = data.draw(st.permutations(ranked)).copy()[: data.draw(st.integers(0, len(ranked)))]
        holdings = [_holding(j) for j in subset]
        expected = sorted(subset, key=lambda j: (*costs[j], j))
        assert [h.job.id for h in ranks.sort(holdings, subset)] == expected
    assert ranks.costs == costs


@settings(max_examples=60, deadline=None)
@given(worlds(max_pending=4), st.data())
def test_a_cycles_ranks_order_preemptible_jobs_by_cost_and_id(world: World, data: st.DataObject) -> None:
    """The ranks the searches of a cycle build (the candidates they meet, with the plugin's own costs) order each
    search's candidates as (cost, id) does, for the plugins that search for victims (`priority`, and `las`, which
    costs otherwise)."""
    state = CycleState(world.snapshot)
    view = state.view
    preemptible = [
        state.holdings[j] for members in state.preemptible_by_group.values() for j in members if j in state.holdings
    ]
    if not preemptible:
        return
    plugin = data.draw(st.sampled_from([profile(name).preempt for name in ("default", "priority", "tiresias")]))
    assert isinstance(plugin, priority_preemption.PriorityPreemption)
    ranked: set[str] = set()
    for _ in range(data.draw(st.integers(1, 3), label="searches")):  # later searches meet jobs ranked already
        sample = data.draw(st.lists(st.sampled_from(preemptible), unique_by=lambda h: h.job.id, min_size=1))
        ids = [h.job.id for h in sample]
        ranks = plugin._ranks(sample, ids, view)
        expected = sorted(sample, key=lambda h: (*plugin.cost(h, view), h.job.id))
        assert [h.job.id for h in ranks.sort(sample, ids)] == [h.job.id for h in expected]
        ranked.update(ids)
        assert set(ranks.rank) == ranked  # costed when a search first meets them, not before
