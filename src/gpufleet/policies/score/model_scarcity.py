"""Score: keep scarce GPU models for the jobs that can run nowhere else (model scarcity).

When some jobs may only run on certain GPU models, a job that could run anywhere should not take the GPUs they
need. FGD alone does not see this: a whole GPU taken leaves nothing fragmented, whatever its model, so on the
openb `gpuspec33` trace (29 % of pods tied to models, T4-only demand about 1.25x the T4 capacity) it fills
T4 nodes with unconstrained pods and the T4-only pods then fail.

**Pressure** of GPU model M, from the target workload (task classes with popularity p_m, GPUs g_m, per-GPU
share s_m, allowed models A_m) and the fleet's GPU capacity C(.) per model set (milli-GPU, from the table):

    pressure(M) = (C_all / D_all) * sum over classes m with models, M in A_m, of  p_m g_m s_m / C(A_m)

i.e. the share of model M's capacity that the model-bound classes need when each spreads its demand over its
allowed models in proportion to their capacity, relative to the fleet's demand per capacity
(D_all = sum over all GPU classes of p_m g_m s_m). Classes that may run anywhere add the same to every model,
so they are left out: with no model-bound class every pressure is 0 and the score is neutral. On openb
`gpuspec33`, T4 is 1.28, P100 0.77, V100 0.5, G3 0.22, G2 0.09.

A node scores `100 / (1 + mean pressure of its GPUs)`: 100 for a model nobody is bound to, 50 where the
model-bound demand equals the average demand per GPU. A job only ever compares nodes it may use, so a job
bound to one model sees equal scores; one that may run anywhere is steered to the least wanted models. Jobs
without GPUs see 100 everywhere (their CPU is left to the other scores).

The pressure depends only on the target and the fleet's capacity, so it is computed once per table layout
(kept while the table's capacity arrays are the same objects: copies share them); scoring is a lookup.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np

from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.scheduling.plugin_api import (
    GENERIC_TARGET,
    ClusterView,
    EvaluationView,
    FloatArray,
    GangContext,
    IntArray,
    JobView,
    NodeInfo,
    TargetWorkload,
    TaskLike,
)

NAME = "model_scarcity"


def model_pressure(table: NodeInfo, target: TargetWorkload) -> FloatArray:
    """Pressure per model id of the table (`table.models` order) plus a last slot, 0, for "no GPU"."""
    models = len(table.models)
    capacity = np.bincount(table.gpu_model[table.gpu_exists], minlength=models + 1).astype(np.float64)
    capacity *= MILLI_PER_GPU
    pressure = np.zeros(models + 1, dtype=np.float64)
    demand_all = 0.0
    for c in target.classes:
        if not c.gpus:
            continue
        demand = c.weight * c.gpus * c.gpu_milli
        demand_all += demand
        if not c.models:
            continue
        allowed = table.spec_lut(c.models)
        room = float(capacity[allowed].sum())
        if room > 0:  # models the fleet does not have: nothing to protect
            pressure[allowed] += demand / room
    if demand_all > 0:
        pressure *= capacity.sum() / demand_all
    pressure[models] = 0.0
    return pressure


def node_scores(table: NodeInfo, pressure: FloatArray) -> FloatArray:
    """`100 / (1 + mean pressure of the node's GPUs)` per node; 100 for nodes without GPUs."""
    per_gpu = np.where(table.gpu_exists, pressure[table.gpu_model], 0.0)
    mean = per_gpu.sum(axis=1) / np.maximum(table.gpu_count, 1)
    return np.asarray(100.0 / (1.0 + mean), dtype=np.float64)


class ModelScarcity:
    """Prefer nodes whose GPU models the target's model-bound classes need least (see the module doc)."""

    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = True

    def __init__(self, target: TargetWorkload | Iterable[TaskLike] = GENERIC_TARGET) -> None:
        self.target = TargetWorkload.of(target)
        self._layout: IntArray | None = None  # the table's gpu_model array the scores were computed for
        self._scores: FloatArray = np.zeros(0, dtype=np.float64)

    def scores_for(self, table: NodeInfo) -> FloatArray:
        """Every node's score (for GPU jobs), computed once per table layout."""
        if self._layout is not table.gpu_model:
            self._scores = node_scores(table, model_pressure(table, self.target))
            self._layout = table.gpu_model
        return self._scores

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        if not view.job.request.gpus:
            return np.full(len(candidates), 100.0, dtype=np.float64)
        return np.asarray(self.scores_for(cluster.nodes)[candidates], dtype=np.float64)
