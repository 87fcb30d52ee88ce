"""Score: topology. A multi-GPU worker inside one NVLink group; a gang on as few nodes and racks as possible."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugins import GangContext, JobView
from gpufleet.scheduling.state import CycleState, Evaluation
from gpufleet.scheduling.table import FloatArray, IntArray, rows_count

NAME = "topology"


class Topology:
    name: ClassVar[str] = NAME

    def score(
        self, view: JobView, state: CycleState, evaluation: Evaluation, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        request = view.job.request
        table = state.table
        parts: list[FloatArray] = []
        if request.gpus > 1:
            parts.append((evaluation.largest_group[candidates] >= request.gpus).astype(np.float64))
        if gang.nodes:
            used = gang.node_array()
            same_node = np.isin(candidates, used)
            same_rack = np.isin(table.rack[candidates], table.rack[used])
            parts.append(0.7 * same_node + 0.3 * same_rack)
        elif view.job.gang_size > 1:
            # The first worker of a gang goes where most of the gang can follow: a node with room
            # for more of its workers, in the rack with the most free GPUs.
            room = rows_count(evaluation.usable[candidates]) // max(1, request.gpus)
            rack_free = np.bincount(table.rack, weights=table.gpu_milli_free.sum(axis=1))
            rack_share = rack_free[table.rack[candidates]] / max(float(rack_free.max()), 1.0)
            parts.append(0.7 * np.minimum(room, view.job.gang_size) / view.job.gang_size + 0.3 * rack_share)
        if not parts:
            return np.zeros(len(candidates), dtype=np.float64)
        return np.asarray(100.0 * np.sum(parts, axis=0) / len(parts), dtype=np.float64)
