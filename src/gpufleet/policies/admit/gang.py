"""Admission: can the whole gang ever fit, and could it fit now? All-or-nothing, across nodes.

Requests no node or the whole cluster could ever hold are UNRESOLVABLE with the reason (more GPUs
per worker than any node has, an unknown model, more workers than the cluster holds). A gang that
cannot fit in what is free now is rejected here at once, without trying worker by worker.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.scheduling.plugin_api import (
    SUCCESS,
    BoolArray,
    ClusterView,
    IntArray,
    JobView,
    Status,
    rows_count,
    unresolvable,
    unschedulable,
)

NAME = "gang"


def _capable_gpus(lut: BoolArray, gpu_memory: int, cluster: ClusterView) -> BoolArray:
    """GPUs of an allowed model with enough memory, free or not (depends on capacity only)."""
    table = cluster.nodes
    return cluster.memo(
        ("gang.capable", lut.tobytes(), gpu_memory),
        lambda: lut[table.gpu_model] & table.gpu_exists & (table.gpu_mem_total >= gpu_memory),
    )


def _workers_per_node(view: JobView, cluster: ClusterView, gpus_per_node: IntArray) -> IntArray:
    request = view.job.request
    table = cluster.nodes
    per_node = gpus_per_node // request.gpus if request.gpus else np.full(len(table), 1 << 30)
    if request.cpu_milli:
        per_node = np.minimum(per_node, table.cpu_free // request.cpu_milli)
    if request.memory:
        per_node = np.minimum(per_node, table.mem_free // request.memory)
    return np.asarray(per_node, dtype=np.int64)


class GangAdmission:
    name: ClassVar[str] = NAME

    def admit(self, view: JobView, cluster: ClusterView) -> Status:
        job = view.job
        ever = cluster.memo(("gang.ever", job.request, job.gang_size), lambda: self._ever(view, cluster))
        if not ever.ok or job.gang_size == 1:
            return ever
        return cluster.current(
            ("gang.now", job.request, job.gang_size, view.model_lut.tobytes()), lambda: self._now(view, cluster)
        )

    def _ever(self, view: JobView, cluster: ClusterView) -> Status:
        """Whether the request could fit in the whole cluster at all: depends on capacity only."""
        job = view.job
        request = job.request
        table = cluster.nodes
        models = request.models
        if models and not any(m in table.model_index for m in models):
            have = ", ".join(table.models) or "none"
            return unresolvable(NAME, f"no node has GPU model {'|'.join(sorted(models))} (the cluster has: {have})")
        if request.cpu_milli > int(table.cpu_total.max(initial=0)):
            largest_cpu = int(table.cpu_total.max(initial=0)) / 1000
            return unresolvable(
                NAME, f"needs {request.cpu_milli / 1000:g} CPUs per worker; the largest node has {largest_cpu:g}"
            )
        if request.memory > int(table.mem_total.max(initial=0)):
            return unresolvable(NAME, "needs more memory per worker than any node has")
        if request.gpus:
            # Whether it could ever fit depends on the spec's models, not on today's quota.
            capable = _capable_gpus(table.model_lut(models), request.gpu_memory, cluster)
            capacity = capable.sum(axis=1)
            largest = int(capacity.max(initial=0))
            what = "|".join(sorted(models)) if models else "any model"
            if request.gpus > largest:
                if largest == 0 and request.gpu_memory:
                    return unresolvable(
                        NAME,
                        f"no GPU ({what}) has {request.gpu_memory / 1024**3:g} GiB of memory",
                    )
                return unresolvable(
                    NAME, f"needs {request.gpus} GPUs ({what}) on one node; the largest node has {largest}"
                )
            ever = int((capacity // request.gpus).sum())
            if job.gang_size > ever:
                return unresolvable(
                    NAME,
                    f"gang of {job.gang_size} workers x {request.gpus} GPUs ({what}); the cluster can hold at "
                    f"most {ever} such workers",
                )
        return SUCCESS

    def _now(self, view: JobView, cluster: ClusterView) -> Status:
        """Whether the gang could fit in what is free now (a quick all-or-nothing check)."""
        job = view.job
        request = job.request
        table = cluster.nodes
        if request.gpus:
            lut = view.model_lut
            capable = cluster.memo(
                ("gang.capable_schedulable", lut.tobytes(), request.gpu_memory),
                lambda: _capable_gpus(lut, request.gpu_memory, cluster) & table.schedulable[:, None],
            )
            if request.fractional:
                free = capable & (table.gpu_milli_free >= request.gpu_milli)
            else:
                free = capable & (table.gpu_milli_free == MILLI_PER_GPU)
            now = int(np.add.reduce(_workers_per_node(view, cluster, rows_count(free))))
        else:
            now = int(_workers_per_node(view, cluster, np.zeros(len(table), dtype=np.int64))[table.schedulable].sum())
        if now < job.gang_size:
            return unschedulable(
                NAME, f"gang of {job.gang_size} workers: only {now} fit in what is free now (all or nothing)"
            )
        return SUCCESS
