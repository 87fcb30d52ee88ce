"""Filter: nodes that are cordoned or unhealthy take no new work."""

from __future__ import annotations

from typing import ClassVar

from gpufleet.scheduling.plugins import FilterResult, JobView
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.table import BoolArray, Rows

NAME = "node_health"
REASON_UNSCHEDULABLE = "cordoned or unhealthy"


class NodeHealth:
    name: ClassVar[str] = NAME

    def filter(self, view: JobView, state: CycleState, usable: BoolArray, rows: Rows) -> FilterResult:
        return FilterResult(((REASON_UNSCHEDULABLE, state.table.schedulable[rows]),))
