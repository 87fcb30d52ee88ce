"""Order: max-min fairness on normalised throughput, greedily (after Gavel's LAS policy; Narayanan et al.,
OSDI 2020, §4.2).

Gavel normalises a job's throughput by what it would get on an equal share of every GPU type. Here a job's
*normalised rate* is its GPUs weighted by its speed on each model over its average speed on the cluster's mix
of models (each model weighted by its share of the cluster's GPUs), from the `ThroughputTable`:

    rate(job) = sum over the models it holds of GPUs(model) * T(job, model) / sum_m share(m) * T(job, m)

Between queues: the queue whose running jobs get the smallest normalised rate per unit of weight goes next,
re-read after every placement (progressive filling, which is how a greedy order approximates max-min
fairness). Within a queue: least attained service first, as wall time on the job's GPUs
(`attained_gpu_seconds / GPUs`), then priority, then FIFO. Jobs carry attained GPU-seconds but not on which
models they were earned, so within a queue service is not normalised by speed; the simulator can fold speed
into `attained_gpu_seconds` if it wants that. Unknown job types and models the table lacks count at rate 1
per GPU; without a table the order is plain max-min fairness on GPUs.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpufleet.domain.jobs import Job
from gpufleet.domain.quotas import GPU_MODEL_PREFIX
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.domain.throughput_table import ThroughputTable, job_scale
from gpufleet.scheduling.plugin_api import ClusterView, SortKey

NAME = "throughput_fair"


def attained_seconds(job: Job) -> float:
    """Wall time of service: attained GPU-seconds over the job's GPUs (GPU-seconds for CPU-only jobs: 0)."""
    gpus = job.gpu_milli_total / MILLI_PER_GPU
    return job.attained_gpu_seconds / gpus if gpus else job.attained_gpu_seconds


class ThroughputFairShare:
    name: ClassVar[str] = NAME

    def __init__(self, table: ThroughputTable | None = None) -> None:
        self._use(table)

    def _use(self, table: ThroughputTable | None) -> None:
        self.table = table
        self._types = frozenset(table.job_types) if table is not None else frozenset()
        self._speedups: dict[tuple[tuple[tuple[str, int], ...], str, int, bool], dict[str, float]] = {}

    def follow(self, measured: ThroughputTable | None) -> None:
        """Read the cycle's measured table (`ClusterView.throughput`) when it has one, dropping what was derived
        from the previous table."""
        if measured is not None and measured is not self.table:
            self._use(measured)

    def mix(self, cluster: ClusterView) -> tuple[tuple[str, int], ...]:
        """GPUs per model of the cluster (depends on capacity only)."""
        table = cluster.nodes

        def compute() -> tuple[tuple[str, int], ...]:
            counts = np.bincount(table.gpu_model[table.gpu_exists], minlength=len(table.models))
            return tuple((m, int(n)) for m, n in zip(table.models, counts, strict=True) if n)

        return cluster.memo(("throughput_fair.mix",), compute)

    def speedups(self, mix: tuple[tuple[str, int], ...], job: Job) -> dict[str, float]:
        """Per model of the cluster: the job's speed there over its average speed on the cluster's mix."""
        if self.table is None or job.job_type not in self._types:
            return {}
        gpus, consolidated = job_scale(job)
        key = (mix, job.job_type, gpus, consolidated)
        cached = self._speedups.get(key)
        if cached is None:
            speeds = {m: self.table.get(job.job_type, m, gpus, consolidated=consolidated) for m, _ in mix}
            measured = [(speeds[m], n) for m, n in mix if speeds[m] is not None]
            weight = sum(n for _, n in measured)
            average = sum(float(s or 0.0) * n for s, n in measured) / weight if weight else 0.0
            cached = {m: float(s) / average for m, s in speeds.items() if s is not None} if average > 0 else {}
            self._speedups[key] = cached
        return cached

    def normalised_rate(self, queue: str, cluster: ClusterView) -> float:
        """Sum over the queue's running jobs (not removed in a what-if) of their normalised rates."""
        self.follow(cluster.throughput)
        mix = self.mix(cluster)
        rate = 0.0
        for job_id, holding in cluster.holdings.items():
            if holding.job.queue != queue or job_id in cluster.removed:
                continue
            speedups = self.speedups(mix, holding.job)
            for key, milli in holding.usage:
                if key.startswith(GPU_MODEL_PREFIX):
                    rate += milli / MILLI_PER_GPU * speedups.get(key[len(GPU_MODEL_PREFIX) :], 1.0)
        return rate

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        return (attained_seconds(job), -job.priority, job.submitted_at)

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        spec = cluster.quotas.queues.get(queue)
        weight = spec.weight if spec is not None else 1.0
        return (self.normalised_rate(queue, cluster) / weight,)
