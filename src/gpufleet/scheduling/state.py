"""The mutable working state of one cycle, built from an immutable snapshot.

It holds the node table and quota ledger, allocates as the cycle decides, and offers the what-if
view that preemption uses: remove jobs, try, and put everything back exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import Job, JobId, RunningJob
from gpufleet.domain.snapshot import ClusterSnapshot
from gpufleet.scheduling.ledger import QuotaLedger, job_usage
from gpufleet.scheduling.table import NodeTable

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Holding:
    """A job that holds resources in this cycle: running before it, or placed by it."""

    job: Job
    workers: tuple[WorkerPlacement, ...]
    usage: tuple[tuple[str, int], ...]
    running: RunningJob | None  # None for a placement made in this cycle


class CycleState:
    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.now = snapshot.now
        self.table = NodeTable(snapshot.nodes)
        self.ledger = QuotaLedger(snapshot.queues)
        self.holdings: dict[JobId, Holding] = {}
        self.node_jobs: dict[int, set[JobId]] = defaultdict(set)
        self.removed: set[JobId] = set()
        self.evicting_for: dict[JobId, list[JobId]] = defaultdict(list)
        self.evicting: set[JobId] = set()
        self._memo: dict[tuple[object, ...], object] = {}
        self.capacity = {
            "gpu": int(self.table.gpu_milli_total.sum()),
            "cpu": int(self.table.cpu_total.sum()),
            "memory": int(self.table.mem_total.sum()),
        }
        for running in sorted(snapshot.running, key=lambda r: r.id):
            for worker in running.workers:
                if worker.node not in self.table.index:
                    raise GpufleetError(
                        f"job {running.id!r} runs on node {worker.node!r}, which is not in the snapshot",
                        "include every node that has running jobs, or mark the job lost first",
                    )
                if not self.table.worker_fits_capacity(worker):
                    raise GpufleetError(
                        f"job {running.id!r} overcommits node {worker.node!r} in the snapshot",
                        "the store holds overlapping allocations; repair them before scheduling",
                    )
                self.table.apply(worker, -1)
            self._hold(running.job, running.workers, running)
            if running.evicting_for is not None:
                self.evicting.add(running.id)
                self.evicting_for[running.evicting_for].append(running.id)

    def memo(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """Per-cycle cache for values that depend only on node capacity (never on free resources)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]  # type: ignore[return-value]

    def usage_of(self, workers: tuple[WorkerPlacement, ...]) -> dict[str, int]:
        milli = 0
        cpu = 0
        mem = 0
        per_model: dict[str, int] = {}
        for worker in workers:
            cpu += worker.cpu_milli
            mem += worker.memory
            for share, model in zip(worker.gpus, self.table.share_models(worker), strict=True):
                milli += share.milli
                per_model[model] = per_model.get(model, 0) + share.milli
        return job_usage(milli, cpu, mem, per_model)

    def _hold(self, job: Job, workers: tuple[WorkerPlacement, ...], running: RunningJob | None) -> None:
        usage = self.usage_of(workers)
        self.holdings[job.id] = Holding(job, workers, tuple(sorted(usage.items())), running)
        self.ledger.add(job.queue, usage)
        for worker in workers:
            self.node_jobs[self.table.index[worker.node]].add(job.id)

    def allocate(self, job: Job, workers: tuple[WorkerPlacement, ...]) -> None:
        """Record a placement decided in this cycle (its workers are already applied to the table)."""
        self._hold(job, workers, None)

    def extend(self, job_id: JobId, worker: WorkerPlacement) -> None:
        """Add one more worker (already applied to the table) to a job placed in this cycle."""
        holding = self.holdings[job_id]
        added = self.usage_of((worker,))
        usage = dict(holding.usage)
        for key, amount in added.items():
            usage[key] = usage.get(key, 0) + amount
        self.holdings[job_id] = Holding(
            holding.job, (*holding.workers, worker), tuple(sorted(usage.items())), holding.running
        )
        self.ledger.add(holding.job.queue, added)
        self.node_jobs[self.table.index[worker.node]].add(job_id)

    def release(self, job_id: JobId) -> None:
        holding = self.holdings.pop(job_id)
        for worker in holding.workers:
            self.table.apply(worker, +1)
            self.node_jobs[self.table.index[worker.node]].discard(job_id)
        self.ledger.add(holding.job.queue, dict(holding.usage), sign=-1)

    # what-if view -------------------------------------------------------------------------------

    def remove(self, job_id: JobId) -> None:
        """Take a running job out of the view (its resources become free) until `restore`."""
        holding = self.holdings[job_id]
        for worker in holding.workers:
            self.table.apply(worker, +1)
        self.ledger.add(holding.job.queue, dict(holding.usage), sign=-1)
        self.removed.add(job_id)

    def restore(self, job_id: JobId) -> None:
        holding = self.holdings[job_id]
        for worker in holding.workers:
            self.table.apply(worker, -1)
        self.ledger.add(holding.job.queue, dict(holding.usage))
        self.removed.discard(job_id)

    @contextmanager
    def without(self, job_ids: list[JobId]) -> Iterator[None]:
        """A what-if view with these jobs removed; everything is restored on exit."""
        for job_id in job_ids:
            self.remove(job_id)
        try:
            yield
        finally:
            for job_id in reversed(job_ids):
                self.restore(job_id)

    def running_on(self, node: int) -> list[Holding]:
        return [self.holdings[j] for j in sorted(self.node_jobs.get(node, ())) if j in self.holdings]

    def fingerprint(self) -> tuple[bytes, ...]:
        """The free-resource arrays as bytes: equal before and after a what-if means restored exactly."""
        t = self.table
        usage = sorted((q, sorted((k, v) for k, v in u.items() if v)) for q, u in self.ledger.usage.items())
        arrays = (t.gpu_milli_free, t.gpu_mem_free, t.cpu_free, t.mem_free)
        return (*(a.tobytes() for a in arrays), repr(usage).encode(), repr(sorted(self.removed)).encode())
