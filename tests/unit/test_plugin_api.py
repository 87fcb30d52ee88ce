"""What plugins are given is read-only: the node arrays refuse writes, quotas offer queries only, the running
jobs and estimates are read-only mappings; and it is the cycle's live state, not a copy."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest

from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.policies.catalog import build_profile
from gpufleet.scheduling.cycle import run_cycle
from gpufleet.scheduling.plugin_api import BoolArray, ClusterView, FilterResult, JobView, Rows
from gpufleet.scheduling.state import CycleState
from tests.kit import cluster, make_job, queue, running_on

FLEET = cluster().nodes(2, "A100-80GB")
SNAPSHOT = FLEET.snapshot(queues=[queue("team").gpus(16)])


def view() -> ClusterView:
    busy = running_on(make_job("r").gpus(2).queue("team").build(), [(SNAPSHOT.nodes[0], range(2))])
    return CycleState(dataclasses.replace(SNAPSHOT, running=(busy,))).view


NODE_ARRAYS = (
    *("gpu_milli_free", "gpu_mem_free", "cpu_free", "mem_free", "node_milli_free", "version", "gpu_exists"),
    *("gpu_model", "gpu_mem_total", "cpu_total", "mem_total", "schedulable", "rack", "gpu_count"),
)


@pytest.mark.parametrize("name", NODE_ARRAYS)
def test_node_arrays_refuse_writes(name: str) -> None:
    array = getattr(view().nodes, name)
    with pytest.raises(ValueError, match="read-only"):
        array[...] = 0


def test_shared_lookup_tables_refuse_writes_and_a_jobs_own_copy_does_not() -> None:
    nodes = view().nodes
    with pytest.raises(ValueError, match="read-only"):
        nodes.spec_lut(frozenset({"A100-80GB"}))[0] = False
    own = nodes.model_lut(frozenset({"A100-80GB"}))
    own[0] = False  # a job's allowed models, which admission narrows
    assert nodes.spec_lut(frozenset({"A100-80GB"}))[0]


def test_quotas_answer_queries_and_cannot_be_changed() -> None:
    cluster_view = view()
    assert cluster_view.quotas.used("team", "gpu") == 2000
    assert not hasattr(cluster_view.quotas, "add")
    assert not hasattr(cluster_view.quotas, "raise_to")
    with pytest.raises(TypeError):
        cluster_view.quotas.queues["team"] = cluster_view.quotas.queues["team"]  # type: ignore[index]


def test_holdings_estimates_and_capacity_are_read_only_mappings() -> None:
    cluster_view = view()
    assert set(cluster_view.holdings) == {"r"}
    for mapping in (cluster_view.holdings, cluster_view.estimates, cluster_view.capacity):
        with pytest.raises(TypeError):
            mapping["x"] = None  # type: ignore[index]


class _Scribbler:
    """A filter that tries to free a node's GPUs by writing the table."""

    name: ClassVar[str] = "scribbler"

    def filter(self, view: JobView, cluster: ClusterView, usable: BoolArray, rows: Rows) -> FilterResult:
        cluster.nodes.gpu_milli_free[rows] = 1000  # type: ignore[index]
        return FilterResult(())


def test_a_plugin_that_writes_the_node_table_fails_the_cycle_loudly() -> None:
    profile = build_profile("scribbles", "fifo", (("bin_pack", 1.0),))
    profile = dataclasses.replace(profile, filters=(*profile.filters, _Scribbler()))
    with pytest.raises(ValueError, match="read-only"):
        run_cycle(SNAPSHOT, [make_job("j").gpus(1).queue("team").build()], profile)


def test_the_view_shows_the_cycle_as_it_changes() -> None:
    state = CycleState(SNAPSHOT)
    free = state.view.nodes.node_milli_free
    before = int(free.sum())
    state.table.apply(WorkerPlacement(SNAPSHOT.nodes[0].name, tuple(GpuShare(g) for g in range(4))), -1)
    assert int(free.sum()) == before - 4000  # the same read-only array, now showing the placement
    copy = state.copy(1.0)
    assert not np.shares_memory(copy.view.nodes.gpu_milli_free, state.view.nodes.gpu_milli_free)
    assert int(copy.view.nodes.node_milli_free.sum()) == before - 4000
