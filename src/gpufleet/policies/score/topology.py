"""Score: topology. A multi-GPU worker inside one NVLink group; a gang on as few nodes and racks as possible."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugin_api import (
    ClusterView,
    EvaluationView,
    FloatArray,
    GangContext,
    IntArray,
    JobView,
    rows_count,
)

NAME = "topology"


class Topology:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = True

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        request = view.job.request
        table = cluster.nodes
        parts: list[FloatArray] = []
        if request.gpus > 1:
            parts.append((evaluation.largest_group[candidates] >= request.gpus).astype(np.float64))
        if gang.nodes:
            used = gang.node_array()
            # Membership by lookup tables over nodes and racks (same answer as np.isin, far cheaper).
            node_used = np.zeros(len(table), dtype=np.bool_)
            node_used[used] = True
            rack_used = np.zeros(table.racks, dtype=np.bool_)
            rack_used[table.rack[used]] = True
            same_node = node_used[candidates]
            same_rack = rack_used[table.rack[candidates]]
            parts.append(0.7 * same_node + 0.3 * same_rack)
        elif view.job.gang_size > 1:
            # The first worker of a gang goes where most of the gang can follow: a node with room
            # for more of its workers, in the rack with the most free GPUs.
            room = rows_count(evaluation.usable[candidates]) // max(1, request.gpus)
            rack_free = np.bincount(table.rack, weights=table.node_milli_free)
            rack_share = rack_free[table.rack[candidates]] / max(float(rack_free.max()), 1.0)
            parts.append(0.7 * np.minimum(room, view.job.gang_size) / view.job.gang_size + 0.3 * rack_share)
        if not parts:
            return np.zeros(len(candidates), dtype=np.float64)
        # At most two parts: their sum in this order is what a sum over the stacked parts gives.
        total = parts[0] if len(parts) == 1 else parts[0] + parts[1]
        return np.asarray(100.0 * total / len(parts), dtype=np.float64)
