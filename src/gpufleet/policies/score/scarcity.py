"""Score: keep scarce GPU models for the jobs that can run nowhere else (model scarcity).

prototype
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np

from gpufleet.scheduling.fragmentation import GENERIC_TARGET, TargetWorkload, TaskLike
from gpufleet.scheduling.plugins import GangContext, JobView
from gpufleet.scheduling.state import CycleState, Evaluation
from gpufleet.scheduling.table import FloatArray, IntArray, NodeTable

NAME = "model_scarcity"


def model_pressure(table: NodeTable, target: TargetWorkload) -> FloatArray:
    """Per model id (plus the no-GPU slot, 0): the target's constrained GPU demand per unit of capacity."""
    capacity = np.zeros(len(table.models) + 1, dtype=np.float64)
    np.add.at(capacity, table.gpu_model[table.gpu_exists], 1000.0)
    pressure = np.zeros(len(table.models) + 1, dtype=np.float64)
    total_demand = 0.0
    for c in target.classes:
        if not c.gpus:
            continue
        demand = c.weight * c.gpus * c.gpu_milli
        total_demand += demand
        if not c.models:
            continue
        lut = table.spec_lut(c.models)
        room = float(capacity[lut].sum())
        if room > 0:
            pressure[lut] += demand / room
    if total_demand > 0:
        pressure *= capacity.sum() / total_demand
    pressure[-1] = 0.0
    return pressure


class ModelScarcity:
    name: ClassVar[str] = NAME

    def __init__(self, target: TargetWorkload | Iterable[TaskLike] = GENERIC_TARGET, *, cpu_only: bool = False) -> None:
        self.target = TargetWorkload.of(target)
        self.cpu_only = cpu_only
        self._models: IntArray | None = None  # the table's gpu_model array (capacity: shared by its copies)
        self._node_score = np.zeros(0, dtype=np.float64)

    def node_local(self, view: JobView) -> bool:
        return True

    def _scores(self, table: NodeTable) -> FloatArray:
        if self._models is not table.gpu_model:
            pressure = model_pressure(table, self.target)
            per_gpu = np.where(table.gpu_exists, pressure[table.gpu_model], 0.0)
            node = per_gpu.sum(axis=1) / np.maximum(table.gpu_count, 1)
            self._node_score = 100.0 / (1.0 + node)
            self._models = table.gpu_model
        return self._node_score

    def score(
        self, view: JobView, state: CycleState, evaluation: Evaluation, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        if not view.job.request.gpus and not self.cpu_only:
            return np.full(len(candidates), 100.0)
        return np.asarray(self._scores(state.table)[candidates], dtype=np.float64)
