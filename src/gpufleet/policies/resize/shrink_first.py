"""LAS preemption for a profile that also resizes: elastic jobs give GPUs by shrinking, not by being stopped.

Under Tiresias' LAS bands (`LasPreemption`) a new job may stop a job of its queue that has had more service.
Where a resize plugin shrinks elastic jobs toward their minimum to admit waiting jobs (`goodput.py`), stopping
a whole elastic job for service throws away all of its GPUs' progress and a restart to free what a shrink
frees for one restart, and the stopped job then waits (Pollux, Qiao et al., OSDI'21, keeps every job running
while there are GPUs for all and shares them by goodput instead). So here a resizable job is never a victim
for service; priority and quota reclaim still stop any job, elastic or not, as `PriorityPreemption` does.

Jobs that are not resizable are ranked exactly as `LasPreemption` ranks them, so on a workload without
elastic jobs every decision is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpufleet.policies.preempt.las import LasPreemption
from gpufleet.scheduling.plugin_api import ClusterView


class ShrinkFirstLas(LasPreemption):
    name: ClassVar[str] = "las-shrink-first"

    def _ranked(self, group: tuple[str, int], members: Sequence[str], cluster: ClusterView) -> list[tuple[int, str]]:
        """LAS's ranking of the group without its resizable jobs (once per group and cycle, as LAS's own)."""
        kept: dict[tuple[str, int], list[tuple[int, str]]] = cluster.per_cycle(("preempt.shrink_first", self), dict)
        ranked = kept.get(group)
        if ranked is None:
            holdings = cluster.holdings
            ranked = [
                (band, job_id)
                for band, job_id in super()._ranked(group, members, cluster)
                if (holding := holdings.get(job_id)) is None or not holding.job.resizable
            ]
            kept[group] = ranked
        return ranked
