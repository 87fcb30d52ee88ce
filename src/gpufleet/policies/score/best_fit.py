"""Score: best fit over CPU and GPU by what a node has left in absolute terms.

The BestFit baseline of Weng et al. (FGD, USENIX ATC 2023): a node's cost is
sum_i w_i * (free_i - request_i) / max_spec_i over CPU and GPU, weights 0.5 each, with the fleet-wide
normalisers 128 cores and 8 GPUs; the lowest cost wins. Unlike `bin_pack`, which normalises by each
node's own capacity, a 2-GPU node with one GPU free and an 8-GPU node with one GPU free cost the same.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugin_api import ClusterView, EvaluationView, FloatArray, GangContext, IntArray, JobView

NAME = "best_fit"
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000


class BestFit:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = True

    def __init__(self, cpu_weight: float = 0.5, gpu_weight: float = 0.5) -> None:
        self.cpu_weight = cpu_weight
        self.gpu_weight = gpu_weight

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        table = cluster.nodes
        request = view.job.request
        cpu_left = (table.cpu_free[candidates] - request.cpu_milli) / MAX_SPEC_CPU_MILLI
        gpu_left = (table.node_milli_free[candidates] - request.gpu_milli_total) / MAX_SPEC_GPU_MILLI
        # minimum(maximum(.)) is np.clip without its Python wrapper (this runs per placement).
        cpu_part = np.minimum(np.maximum(cpu_left, 0.0), 1.0)
        gpu_part = np.minimum(np.maximum(gpu_left, 0.0), 1.0)
        cost = self.cpu_weight * cpu_part + self.gpu_weight * gpu_part
        return np.asarray(100.0 * (1.0 - cost), dtype=np.float64)
