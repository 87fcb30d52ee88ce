"""Score: topology. A multi-GPU worker inside one NVLink group; a gang on as few nodes and racks as possible; for a
job that declares what it synchronises (`Job.comm`), the node whose ring all-reduce costs the least of each step."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.domain.comm import CommNeeds, allreduce_seconds, overhead_share
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
        comm = view.job.comm
        if comm is not None and view.job.gang_size * request.gpus > 1:
            parts.append(1.0 - predicted_overhead(comm, view, cluster, evaluation, candidates, gang))
            return np.asarray(100.0 * np.sum(parts, axis=0) / len(parts), dtype=np.float64)
        if not parts:
            return np.zeros(len(candidates), dtype=np.float64)
        # At most two parts: their sum in this order is what a sum over the stacked parts gives.
        total = parts[0] if len(parts) == 1 else parts[0] + parts[1]
        return np.asarray(100.0 * total / len(parts), dtype=np.float64)


def predicted_overhead(
    comm: CommNeeds,
    view: JobView,
    cluster: ClusterView,
    evaluation: EvaluationView,
    candidates: IntArray,
    gang: GangContext,
) -> FloatArray:
    """Per candidate: the all-reduce share of each step were this worker placed there and the node then filled with
    as many of the gang's workers as fit (`domain.comm`: the ring runs at its slowest link; between nodes, at the
    ports of the node holding the fewest of the job's GPUs)."""
    table = cluster.nodes
    per_worker = max(1, view.job.request.gpus)
    size = view.job.gang_size
    ranks = size * per_worker
    room = rows_count(evaluation.usable[candidates]) // per_worker
    on_node = np.zeros(len(table), dtype=np.int64)
    others_min = np.full(len(candidates), np.inf)
    others = np.zeros(len(candidates), dtype=np.bool_)
    if gang.nodes:
        used, count = np.unique(gang.node_array(), return_counts=True)
        on_node[used] = count
        ports = count * per_worker * table.network_gbps[used]
        order = np.argsort(ports, kind="stable")
        first = float(ports[order[0]])
        second = float(ports[order[1]]) if len(order) > 1 else np.inf
        others_min = np.where(candidates == used[order[0]], second, first)
        others = (len(used) > 1) | (candidates != used[0])
    expected = np.minimum(on_node[candidates] + room, size)
    gpus_here = expected * per_worker
    intra = np.where(
        evaluation.largest_group[candidates] >= gpus_here - on_node[candidates] * per_worker,
        table.nvlink_gbps[candidates],
        table.pcie_gbps[candidates],
    )
    alone = (expected >= size) & ~others
    spread = np.minimum(np.minimum(gpus_here * table.network_gbps[candidates], others_min), intra)
    bus = np.where(alone, intra, spread)
    return np.asarray(
        overhead_share(allreduce_seconds(comm.grad_bytes, ranks, bus), comm.step_time_s), dtype=np.float64
    )
