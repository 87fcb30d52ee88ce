"""Filter: only GPUs of a model the job allows, and that its queue's quota still admits."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.scheduling.plugin_api import BoolArray, ClusterView, FilterResult, JobView, Rows, rows_any

NAME = "gpu_model"
REASON_WRONG_MODEL = "wrong GPU model"
REASON_MODEL_OVER_QUOTA = "GPU model over the queue's quota"


class GpuModel:
    name: ClassVar[str] = NAME

    def filter(self, view: JobView, cluster: ClusterView, usable: BoolArray, rows: Rows) -> FilterResult:
        if view.job.request.gpus == 0:
            return FilterResult(())
        table = cluster.nodes
        spec_lut = table.spec_lut(view.job.request.models)
        allowed = view.model_lut[table.gpu_model[rows]]
        np.logical_and(usable, allowed, out=usable)
        if spec_lut.tobytes() == view.model_lut.tobytes():  # admission left every model of the spec
            return FilterResult(((REASON_WRONG_MODEL, rows_any(usable)),))
        spec_ok = rows_any(spec_lut[table.gpu_model[rows]] & table.gpu_exists[rows])
        return FilterResult(((REASON_WRONG_MODEL, spec_ok), (REASON_MODEL_OVER_QUOTA, rows_any(usable))))
