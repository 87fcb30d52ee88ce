"""Filter: nodes that are cordoned or unhealthy take no new work."""

from __future__ import annotations

from typing import ClassVar

from gpufleet.scheduling.plugin_api import BoolArray, ClusterView, FilterResult, JobView, Rows

NAME = "node_health"
REASON_UNSCHEDULABLE = "cordoned or unhealthy"


class NodeHealth:
    name: ClassVar[str] = NAME

    def filter(self, view: JobView, cluster: ClusterView, usable: BoolArray, rows: Rows) -> FilterResult:
        return FilterResult(((REASON_UNSCHEDULABLE, cluster.nodes.schedulable[rows]),))
