"""Order: weighted dominant resource fairness (DRF) between queues; priority, then FIFO, inside a queue.

Queues within their nominal quota go first. Then the queue whose dominant share (the largest of
its GPU, CPU and memory shares of the cluster, over its weight) is smallest goes next, and shares
are re-read after every decision, so one cycle interleaves queues as Kueue's fair sharing and
YuniKorn's DRF do (Ghodsi et al., NSDI 2011).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.plugin_api import ClusterView, SortKey

NAME = "fair_share"


def weighted_dominant_share(used: Mapping[str, int], capacity: Mapping[str, int], weight: float) -> float:
    """The largest of a queue's shares of the cluster's GPU, CPU and memory (`capacity`, base units), over
    its weight. The dashboard shows the same number the order uses."""
    share = 0.0
    for key, total in capacity.items():
        if total > 0:
            share = max(share, used.get(key, 0) / total)
    return share / weight


def dominant_share(queue: str, cluster: ClusterView) -> float:
    spec = cluster.quotas.queues.get(queue)
    weight = spec.weight if spec is not None else 1.0
    used = {key: cluster.quotas.used(queue, key) for key in cluster.capacity}
    return weighted_dominant_share(used, cluster.capacity, weight)


class FairShare:
    name: ClassVar[str] = NAME

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        return (-job.priority, job.submitted_at)

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        # Queues still inside their guaranteed quota go before queues that would borrow, so idle
        # quota is lent only after guarantees are served and less has to be reclaimed later.
        borrowing = cluster.quotas.over_nominal(queue)
        return (int(borrowing), dominant_share(queue, cluster))
