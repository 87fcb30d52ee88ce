"""Score: best-fit bin packing. Nodes left with the least free GPU after placement score highest,
so large holes stay open for large jobs (and CPU-only workers pack by CPU)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugin_api import ClusterView, EvaluationView, FloatArray, GangContext, IntArray, JobView

NAME = "bin_pack"


def free_fraction_after(view: JobView, cluster: ClusterView, candidates: IntArray) -> FloatArray:
    """Fraction of each candidate node's capacity left free once the worker is placed there."""
    table = cluster.nodes
    request = view.job.request
    if request.gpus:
        free = table.node_milli_free[candidates] - request.gpu_milli_total
        total = table.gpu_milli_divisor[candidates]
    else:
        free = table.cpu_free[candidates] - request.cpu_milli
        total = table.cpu_divisor[candidates]
    # minimum(maximum(.)) is np.clip without its Python wrapper (this runs per placement).
    fraction = free / total
    return np.asarray(np.minimum(np.maximum(fraction, 0.0, out=fraction), 1.0, out=fraction), dtype=np.float64)


class BinPack:
    name: ClassVar[str] = NAME
    node_local: ClassVar[bool] = True

    def score(
        self, view: JobView, cluster: ClusterView, evaluation: EvaluationView, candidates: IntArray, gang: GangContext
    ) -> FloatArray:
        return 100.0 * (1.0 - free_fraction_after(view, cluster, candidates))
