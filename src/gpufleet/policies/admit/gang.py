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


def _capable_gpus(lut: BoolArray, gpu_memory: int, spot: bool, cluster: ClusterView) -> BoolArray:
    """GPUs of an allowed model with enough memory, on nodes the job may use as to spot (`spot`: spot nodes
    too), free or not (depends on capacity only)."""
    table = cluster.nodes

    def compute() -> BoolArray:
        capable = lut[table.gpu_model] & table.gpu_exists & (table.gpu_mem_total >= gpu_memory)
        return capable if spot else capable & ~table.spot[:, None]

    return cluster.memo(("gang.capable", lut.tobytes(), gpu_memory, spot), compute)


def _spot_ok(view: JobView) -> bool:
    """Whether the job may run on spot nodes (the `spot` filter refuses them to `spot: never`)."""
    return view.job.request.spot != "never"


def _schedulable_capable(view: JobView, cluster: ClusterView) -> BoolArray:
    """`_capable_gpus` on nodes that take new work."""
    request, lut, spot = view.job.request, view.model_lut, _spot_ok(view)
    table = cluster.nodes
    return cluster.memo(
        ("gang.capable_schedulable", lut.tobytes(), request.gpu_memory, spot),
        lambda: _capable_gpus(lut, request.gpu_memory, spot, cluster) & table.schedulable[:, None],
    )


class _WorkersNow:
    """Per node, how many workers of a request fit in what is free now, and their total, as of the table's
    `clock`: brought up to date by recounting only the nodes changed since (`version`), so the gang check asked
    after each step of a victim search costs a comparison over the nodes, not a recount of every GPU."""

    __slots__ = ("clock", "per_node", "total")

    def __init__(self, per_node: IntArray, clock: int) -> None:
        self.per_node = per_node
        self.total = int(np.add.reduce(per_node))
        self.clock = clock


def _workers_now(view: JobView, cluster: ClusterView, rows: IntArray | None) -> IntArray:
    """Per node (of `rows`, or all): workers of the request that fit in what is free now; 0 on nodes that take
    no new work."""
    request = view.job.request
    table = cluster.nodes
    at: IntArray | slice = slice(None) if rows is None else rows
    if request.gpus:
        capable = _schedulable_capable(view, cluster)[at]
        milli = table.gpu_milli_free[at]
        free = capable & ((milli >= request.gpu_milli) if request.fractional else (milli == MILLI_PER_GPU))
        per_node = rows_count(free) // request.gpus
    else:
        per_node = np.full(len(table.cpu_free[at]), 1 << 30, dtype=np.int64)
    if request.cpu_milli:
        per_node = np.minimum(per_node, table.cpu_free[at] // request.cpu_milli)
    if request.memory:
        per_node = np.minimum(per_node, table.mem_free[at] // request.memory)
    if not request.gpus:
        per_node = np.where(table.schedulable[at], per_node, 0)
    return np.asarray(per_node, dtype=np.int64)


class GangAdmission:
    name: ClassVar[str] = NAME
    # More free GPUs, CPU and memory on a node never fit fewer workers there: monotone.
    monotone: ClassVar[bool] = True

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
            problem = _gpu_capacity_problem(view, cluster, spot=_spot_ok(view))
            if problem is None:
                return SUCCESS
            if (
                not _spot_ok(view)
                and bool(table.spot.any())
                and _gpu_capacity_problem(view, cluster, spot=True) is None
            ):
                problem += " outside spot capacity, which the job does not allow (spot: never)"
            return unresolvable(NAME, problem)
        return SUCCESS

    def _now(self, view: JobView, cluster: ClusterView) -> Status:
        """Whether the gang could fit in what is free now (a quick all-or-nothing check)."""
        job = view.job
        now = _count_now(view, cluster)
        if now < job.gang_size:
            return unschedulable(
                NAME, f"gang of {job.gang_size} workers: only {now} fit in what is free now (all or nothing)"
            )
        return SUCCESS


def _gpu_capacity_problem(view: JobView, cluster: ClusterView, *, spot: bool) -> str | None:
    """Why no set of nodes (spot ones too, with `spot`) could ever hold the request's gang, or None."""
    job = view.job
    request = job.request
    models = request.models
    capacity = _capable_gpus(cluster.nodes.model_lut(models), request.gpu_memory, spot, cluster).sum(axis=1)
    largest = int(capacity.max(initial=0))
    what = "|".join(sorted(models)) if models else "any model"
    if request.gpus > largest:
        if largest == 0 and request.gpu_memory:
            return f"no GPU ({what}) has {request.gpu_memory / 1024**3:g} GiB of memory"
        return f"needs {request.gpus} GPUs ({what}) on one node; the largest node has {largest}"
    ever = int((capacity // request.gpus).sum())
    if job.gang_size > ever:
        return (
            f"gang of {job.gang_size} workers x {request.gpus} GPUs ({what}); the cluster can hold at most {ever} "
            "such workers"
        )
    return None


def _count_now(view: JobView, cluster: ClusterView) -> int:
    """How many workers of the request fit in what is free now, over all nodes: kept for the cycle per request
    (the per-node counts do not depend on the gang's size) and recounted on the nodes changed since."""
    table = cluster.nodes
    kept: _WorkersNow = cluster.per_cycle(
        ("gang.workers_now", view.job.request, view.model_lut.tobytes()),
        lambda: _WorkersNow(_workers_now(view, cluster, None), table.clock),
    )
    if kept.clock != table.clock:
        changed: IntArray = (table.version > kept.clock).nonzero()[0]
        if len(changed) <= _FEW_NODES:
            # Most recounts follow one victim taken out or put back: one node, where numpy's per-call cost
            # was ten times the arithmetic.
            per_node = kept.per_node
            for i in changed.tolist():
                workers = _workers_on(view, cluster, i)
                kept.total += workers - int(per_node[i])
                per_node[i] = workers
        else:
            recounted = _workers_now(view, cluster, changed)
            kept.total += int(np.add.reduce(recounted)) - int(np.add.reduce(kept.per_node[changed]))
            kept.per_node[changed] = recounted
        kept.clock = table.clock
    return kept.total


_FEW_NODES = 4  # up to this many changed nodes, `_count_now` recounts node by node in plain Python


def _workers_on(view: JobView, cluster: ClusterView, node: int) -> int:
    """`_workers_now` for one node, over Python numbers: the same count."""
    request = view.job.request
    table = cluster.nodes
    if request.gpus:
        capable = _schedulable_capable(view, cluster)[node].tolist()
        milli = table.gpu_milli_free[node].tolist()
        if request.fractional:
            free = sum(1 for ok, m in zip(capable, milli, strict=True) if ok and m >= request.gpu_milli)
        else:
            free = sum(1 for ok, m in zip(capable, milli, strict=True) if ok and m == MILLI_PER_GPU)
        workers = free // request.gpus
    else:
        workers = 1 << 30
    if request.cpu_milli:
        workers = min(workers, int(table.cpu_free[node]) // request.cpu_milli)
    if request.memory:
        workers = min(workers, int(table.mem_free[node]) // request.memory)
    if not request.gpus and not table.schedulable[node]:
        workers = 0
    return workers
