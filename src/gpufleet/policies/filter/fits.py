"""Filter: enough free GPUs (or a GPU with a free share), GPU memory, CPU and memory on the node."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.scheduling.plugin_api import BoolArray, ClusterView, FilterResult, JobView, Rows, rows_any, rows_count

NAME = "fits"
REASON_GPU_MEMORY = "too little memory per GPU"
REASON_FEW_GPUS = "too few free GPUs"
REASON_NO_SHARE = "no GPU with a free share that large"
REASON_CPU = "not enough free CPU"
REASON_MEMORY = "not enough free memory"


class Fits:
    name: ClassVar[str] = NAME

    def filter(self, view: JobView, cluster: ClusterView, usable: BoolArray, rows: Rows) -> FilterResult:
        request = view.job.request
        table = cluster.nodes
        checks: list[tuple[str, BoolArray]] = []
        if request.gpus:
            if request.gpu_memory:
                np.logical_and(usable, table.gpu_mem_total[rows] >= request.gpu_memory, out=usable)
                checks.append((REASON_GPU_MEMORY, rows_any(usable)))
            if request.fractional:
                np.logical_and(usable, table.gpu_milli_free[rows] >= request.gpu_milli, out=usable)
                if request.gpu_memory:
                    np.logical_and(usable, table.gpu_mem_free[rows] >= request.gpu_memory, out=usable)
                checks.append((REASON_NO_SHARE, rows_any(usable)))
            else:
                np.logical_and(usable, table.gpu_milli_free[rows] == MILLI_PER_GPU, out=usable)
                checks.append((REASON_FEW_GPUS, rows_count(usable) >= request.gpus))
        if request.cpu_milli:
            checks.append((REASON_CPU, table.cpu_free[rows] >= request.cpu_milli))
        if request.memory:
            checks.append((REASON_MEMORY, table.mem_free[rows] >= request.memory))
        return FilterResult(tuple(checks))
