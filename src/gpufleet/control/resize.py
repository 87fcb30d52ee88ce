"""Resizing running elastic jobs: the step of the control loop that asks the profile's resize plugin for new
sizes and turns its answer into resizes. Live and in the simulator alike, every `Profile.resize_every_s`.

What the plugin is given (`ResizeInput`): every RUNNING elastic job (`min_workers < workers`, whole GPUs per
worker, no resize under way) with its goodput at each size from `min_workers` to `workers` workers, the
whole GPUs free on schedulable nodes, each quota-limited queue's GPU headroom, and the jobs left waiting for
room (UNSCHEDULABLE) in submission order. Goodput comes from the job's stored progress history
(`control/goodput.py`; its prior before any report), divided by its goodput at its current size: a speed-up,
comparable between jobs whatever units each reports in.

How holdings change (so that no GPU is ever held twice):

- **Grow.** The extra workers are placed at the decision by the core itself, on a fork of the loop's state,
  as a job of the extra workers in the same queue with preemption off (filters, scores, quota: the same
  checks any placement passes); the job holds old + new workers from then on, and the backend restarts it on
  all of them. A resize restarts every worker anyway, so the whole job is also placed anew the same way (its
  own GPUs counted free): when that spans fewer nodes, the job runs there instead, holding its old workers
  as well until RESIZED.
- **Shrink.** The job keeps its workers on the nodes where it has the most GPUs (the sparsest nodes are given
  back first); it holds all of its old workers until the backend reports RESIZED (its old workers may still
  be saving a checkpoint until then), and only then gives back the rest.

A job being resized is not resized again before RESIZED; the plugin's own guard rails (minimum interval,
restart cost, never below min, quota headroom) apply on top. Backends that cannot resize
(`capabilities.resize` False) are never asked: jobs then keep their size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from gpufleet.control.changes import attained_until
from gpufleet.control.goodput import goodput_by_size
from gpufleet.control.loop_state import LoopState
from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.progress import JobProgress, with_size
from gpufleet.domain.quotas import GPU
from gpufleet.domain.records import JobRecord
from gpufleet.scheduling.cycle import decide
from gpufleet.scheduling.ledger import job_usage
from gpufleet.scheduling.plugin_api import ElasticJob, Profile, ResizeInput, ResizePlugin
from gpufleet.scheduling.status import Code
from gpufleet.scheduling.table import NodeTable

MILLI = 1000
# At most this many waiting jobs are offered to the plugin each time (the first in submission order).
MAX_WAITING = 256


@runtime_checkable
class ProgressReader(Protocol):
    """Where jobs' progress histories are kept (the store, live and simulated)."""

    def job_progress(self, job_id: str) -> JobProgress | None: ...

    def update_progress(self, job_id: str, now: float, update: Callable[[JobProgress], JobProgress]) -> JobProgress: ...


class Resizer:
    """When to resize and to what; the reconciler applies what it returns."""

    def __init__(self, plugin: ResizePlugin, profile: Profile, progress: ProgressReader | None) -> None:
        self.plugin = plugin
        self.every_s = profile.resize_every_s
        self.progress = progress
        # Extra workers of a grow are placed as any job of their queue, but never by preempting.
        self.grow_profile = dataclasses.replace(profile, preempt=None, elastic_grow=False, resize=None)
        self._next: float | None = None
        self.active = False  # elastic jobs were running when last looked (the loop then steps at each interval)
        self._waiting = 0  # jobs waiting when last asked

    def due(self, now: float, waiting: int = 0) -> bool:
        """Whether to resize now: at each interval, and also as soon as more jobs wait than when last asked
        while elastic jobs run (a newcomer is admitted by a shrink on arrival, not at the next interval)."""
        more_waiting = self.active and waiting > self._waiting
        self._waiting = waiting
        if more_waiting:
            return True
        if self._next is not None and now < self._next:
            return False
        self._next = (math.floor(now / self.every_s) + 1) * self.every_s
        return True

    def next_at(self, now: float) -> float:
        return self._next if self._next is not None else now

    def sizes(
        self, now: float, base: LoopState, running: Iterable[JobRecord], waiting: Sequence[tuple[Job, JobRecord]]
    ) -> Mapping[JobId, int]:
        """The plugin's new sizes (in workers) for the running elastic jobs whose size should change."""
        table = base.table
        whole_free = (table.gpu_milli_free == MILLI) & table.schedulable[:, None]
        node_gpus = int(table.gpu_count.max()) if len(table.gpu_count) else None
        jobs = tuple(
            self._elastic(now, r, _one_node_gpus(table, whole_free, r), node_gpus)
            for r in running
            if r.state is JobState.RUNNING and not r.resizing
        )
        if not jobs:
            return {}
        free = int(whole_free.sum())
        queues = {j.queue for j in jobs} | {job.queue for job, _ in waiting}
        total = int(table.gpu_count.sum())
        headroom = {q: room for q in sorted(queues) if (room := _headroom(base, q, total)) is not None}
        wanted = tuple(
            (job.queue, job.gang_size * max(1, job.request.gpus))
            for job, record in waiting
            if record.waiting_code == Code.UNSCHEDULABLE.value
        )[:MAX_WAITING]
        given = ResizeInput(now, free, jobs, headroom, wanted)
        steps = {j.id: j.step for j in jobs}
        return {job_id: gpus // steps[job_id] for job_id, gpus in self.plugin.resize(given).items()}

    def _elastic(
        self, now: float, record: JobRecord, gpus_per_node: int | None, node_gpus: int | None = None
    ) -> ElasticJob:
        job = record.job
        step = job.request.gpus
        current = len(record.workers)
        sizes = range(job.gang_size * step, job.workers * step + 1, step)
        progress = self.progress.job_progress(job.id) if self.progress is not None else None
        goodput = goodput_by_size(progress, current * step, sizes, gpus_per_node, node_gpus)
        now_rate = goodput.get(current * step) or 1.0
        return ElasticJob(
            id=job.id,
            queue=job.queue,
            gpus=current * step,
            min_gpus=job.gang_size * step,
            max_gpus=job.workers * step,
            step=step,
            goodput={g: rate / now_rate for g, rate in goodput.items()},
            last_resized_at=record.resized_at,
            attained_gpu_s=attained_until(record, now),
        )

    def record_size(self, record: JobRecord) -> None:
        """The job's GPU count over time in its progress history gets its new size."""
        if self.progress is not None and record.resized_at is not None:
            gpus = len(record.workers) * record.job.request.gpus
            at = record.resized_at
            self.progress.update_progress(record.id, at, lambda progress: with_size(progress, at, gpus))

    def grow(self, now: float, base: LoopState, record: JobRecord, workers: int) -> Regrow | None:
        """Where the job runs grown to `workers` workers (None: the extra ones do not fit): its workers kept
        and more added, or the whole job placed anew when that spans fewer nodes (a resize restarts every
        worker anyway; its own GPUs count as free for that what-if)."""
        current = record.workers
        added = self.extra_workers(now, base, record, workers - len(current))
        kept = None if added is None else (*current, *added)
        gathered = self._gathered(now, base, record, workers)
        if gathered is not None and (kept is None or _node_count(gathered) < _node_count(kept)):
            fresh = tuple(w for w in gathered if w not in current)
            if _fit_beside(now, base, record.job.queue, fresh):
                return Regrow(held=(*current, *fresh), target=gathered)
        return None if kept is None else Regrow(held=kept, target=kept)

    def extra_workers(
        self, now: float, base: LoopState, record: JobRecord, extra: int
    ) -> tuple[WorkerPlacement, ...] | None:
        """Where `extra` more workers of the job would go now (None: they do not fit)."""
        probe = dataclasses.replace(
            record.as_pending(), id=f"{record.id}/grow", workers=extra, min_workers=None, name=""
        )
        work = base.fork(now)
        work.queued = ()
        result = decide(work, [probe], self.grow_profile)
        placed = [p.workers for p in result.placements if p.job == probe.id]
        return placed[0] if placed and len(placed[0]) == extra else None

    def _gathered(
        self, now: float, base: LoopState, record: JobRecord, workers: int
    ) -> tuple[WorkerPlacement, ...] | None:
        """Where all `workers` workers of the job would go were its own GPUs free (None: they do not fit, or
        a new worker would share a GPU with an old one it is not: both are held until RESIZED)."""
        if record.id not in base.holdings:
            return None
        probe = dataclasses.replace(
            record.as_pending(), id=f"{record.id}/gather", workers=workers, min_workers=None, name=""
        )
        work = base.fork(now)
        work.queued = ()
        work.remove_running(record.id)
        result = decide(work, [probe], self.grow_profile)
        placed = [p.workers for p in result.placements if p.job == probe.id]
        if not placed or len(placed[0]) != workers:
            return None
        old = {(w.node, i) for w in record.workers for i in w.gpu_indices}
        if any((w.node, i) in old for w in placed[0] if w not in record.workers for i in w.gpu_indices):
            return None
        return placed[0]


@dataclasses.dataclass(frozen=True)
class Regrow:
    """A grow's workers: `held` from the decision until RESIZED (the old ones and the new), `target` after."""

    held: tuple[WorkerPlacement, ...]
    target: tuple[WorkerPlacement, ...]


def _fit_beside(now: float, base: LoopState, queue: str, fresh: Sequence[WorkerPlacement]) -> bool:
    """Whether the new workers of a re-placed job fit while it still holds its old ones (until RESIZED): on
    their nodes and within its queue's quota."""
    table = base.fork(now).table
    models: dict[str, int] = {}
    for worker in fresh:
        if not table.worker_fits_capacity(worker):
            return False
        table.apply(worker, -1)
        row = table.index[worker.node]
        for share in worker.gpus:
            model = table.models[int(table.gpu_model[row, share.index])]
            models[model] = models.get(model, 0) + share.milli
    gpu_milli = sum(models.values())
    cpu_milli = sum(w.cpu_milli for w in fresh)
    memory = sum(w.memory for w in fresh)
    ledger = base.state.ledger
    usage = job_usage(gpu_milli, cpu_milli, memory, models)
    return all(ledger.fits(queue, key, amount).fits for key, amount in usage.items())


def kept_on_densest(workers: Sequence[WorkerPlacement], keep: int) -> tuple[WorkerPlacement, ...]:
    """The `keep` workers a shrink keeps: those on the nodes where the job has the most GPUs (the sparsest
    nodes are given back first; ties keep the earlier workers), in their order."""
    on_node: dict[str, int] = {}
    for worker in workers:
        on_node[worker.node] = on_node.get(worker.node, 0) + len(worker.gpus)
    ranked = sorted(range(len(workers)), key=lambda i: (-on_node[workers[i].node], workers[i].node, i))
    return tuple(workers[i] for i in sorted(ranked[:keep]))


def _node_count(workers: Iterable[WorkerPlacement]) -> int:
    return len({w.node for w in workers})


def _one_node_gpus(table: NodeTable, whole_free: npt.NDArray[np.bool_], record: JobRecord) -> int:
    """The most GPUs the job can hold on one node as it is placed: on its node, what it holds there and the
    whole GPUs free there (a grow beyond goes to other nodes); a job already on several nodes, 1 (every size
    but one GPU spans nodes: a grow re-places the job onto fewer nodes only when the core places it so, and
    counting on that was measured to do worse)."""
    nodes = {w.node for w in record.workers}
    if len(nodes) != 1:
        return 1
    row = table.index.get(next(iter(nodes)))
    held = sum(len(w.gpus) for w in record.workers)
    return held + (int(whole_free[row].sum()) if row is not None else 0)


def _headroom(base: LoopState, queue: str, most: int) -> int | None:
    """Whole GPUs the queue may still take within its quota (None: its quota does not limit GPUs)."""
    ledger = base.state.ledger
    quota = ledger.quota(queue, GPU) if queue in ledger.queues else None
    if quota is None or quota.nominal is None:
        return None
    low, high = 0, most
    while low < high:  # the largest k that fits
        mid = (low + high + 1) // 2
        if ledger.fits(queue, GPU, mid * MILLI).fits:
            low = mid
        else:
            high = mid - 1
    return low
