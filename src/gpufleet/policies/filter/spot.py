"""Filter: spot capacity only for jobs that allow it, and what an open spot circuit breaker still admits.

A node of the `spot` pool takes a worker only if its request says `spot: allowed` or `preferred`. While the
circuit breaker of a spot pool is open, the control plane marks the pool's nodes (`NodeInfo.admits`): `1`
takes only workers that resume from checkpoints (`request.checkpoints`), `2` takes no new worker. Both are
data in the snapshot; this filter only reads them.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugin_api import BoolArray, ClusterView, FilterResult, JobView, Rows

NAME = "spot"
REASON_NOT_ALLOWED = "spot capacity, which the job does not allow (spot: never)"
REASON_CLOSED = "spot pool's circuit breaker is open: no new placements"
REASON_CHECKPOINTS_ONLY = "spot pool's circuit breaker is open: only jobs that checkpoint"
ADMITS_CHECKPOINTING, ADMITS_NONE = 1, 2


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
        return FilterResult(
            (
                (REASON_NOT_ALLOWED, allowed),
                (REASON_CLOSED if request.checkpoints else REASON_CHECKPOINTS_ONLY, ~gated),
            )
        )
