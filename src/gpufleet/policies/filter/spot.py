"""Filter: spot capacity only for jobs that allow it, and what a spot pool's circuit breaker still admits.

A node of the `spot` pool takes a worker only if its request says `spot: allowed` or `preferred`. While the
circuit breaker of a spot pool is open, the control plane marks the pool's nodes (`NodeInfo.admits`): `1`
takes only workers that resume from checkpoints (`request.checkpoints`), `2` takes no new worker. While it is
half-open and waits for its probe, `3`: the pool takes one job, so once a job placed in this cycle holds a
node so marked, the other nodes of its pool (its zone) take nobody else this cycle; the control plane's next
breaker step names that job the probe and shuts the gate. All of it is data in the snapshot; this filter
only reads it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugin_api import BoolArray, ClusterView, FilterResult, JobView, Rows

NAME = "spot"
REASON_NOT_ALLOWED = "spot capacity, which the job does not allow (spot: never)"
REASON_CLOSED = "spot pool's circuit breaker is open: no new placements"
REASON_CHECKPOINTS_ONLY = "spot pool's circuit breaker is open: only jobs that checkpoint"
REASON_PROBED = "spot pool's circuit breaker is half-open and took its one probe job"
ADMITS_CHECKPOINTING, ADMITS_NONE, ADMITS_PROBE = 1, 2, 3


class SpotFilter:
    name: ClassVar[str] = NAME

    def filter(self, view: JobView, cluster: ClusterView, usable: BoolArray, rows: Rows) -> FilterResult:
        table = cluster.nodes
        request = view.job.request
        spot = table.spot[rows]
        admits = table.admits[rows]
        allowed = ~spot if request.spot == "never" else np.ones_like(spot)
        gated = admits == ADMITS_NONE
        if not request.checkpoints:
            gated |= admits == ADMITS_CHECKPOINTING
        reasons = [
            (REASON_NOT_ALLOWED, allowed),
            (REASON_CLOSED if request.checkpoints else REASON_CHECKPOINTS_ONLY, ~gated),
        ]
        probe = admits == ADMITS_PROBE
        if probe.any():
            probed = _probed_zones(cluster)
            if probed:
                reasons.append((REASON_PROBED, ~(probe & np.isin(table.zone[rows], probed))))
        return FilterResult(tuple(reasons))


def _probed_zones(cluster: ClusterView) -> list[int]:
    """The zones (spot pools) of probe-gated nodes that a job placed in this cycle already holds."""
    table = cluster.nodes
    zones: set[int] = set()
    for holding in cluster.holdings.values():
        if holding.running is not None:
            continue
        for worker in holding.workers:
            row = table.index[worker.node]
            if table.admits[row] == ADMITS_PROBE:
                zones.add(int(table.zone[row]))
    return sorted(zones)
