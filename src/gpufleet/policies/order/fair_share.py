"""Order: weighted dominant resource fairness (DRF) between queues; priority, then FIFO, inside a queue.

Queues within their nominal quota go first. Then the queue whose dominant share (the largest of
its GPU, CPU and memory shares of the cluster, over its weight) is smallest goes next, and shares
are re-read after every decision, so one cycle interleaves queues as Kueue's fair sharing and
YuniKorn's DRF do (Ghodsi et al., NSDI 2011).
"""

from __future__ import annotations

from typing import ClassVar

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.plugins import SortKey
from gpufleet.scheduling.state import CycleState

NAME = "fair_share"


def dominant_share(queue: str, state: CycleState) -> float:
    spec = state.ledger.queues.get(queue)
    weight = spec.weight if spec is not None else 1.0
    share = 0.0
    for key, capacity in state.capacity.items():
        if capacity > 0:
            share = max(share, state.ledger.used(queue, key) / capacity)
    return share / weight


class FairShare:
    name: ClassVar[str] = NAME

    def job_key(self, job: Job, state: CycleState) -> SortKey:
        return (-job.priority, job.submitted_at)

    def queue_key(self, queue: str, state: CycleState) -> SortKey:
        # Queues still inside their guaranteed quota go before queues that would borrow, so idle
        # quota is lent only after guarantees are served and less has to be reclaimed later.
        borrowing = state.ledger.over_nominal(queue)
        return (int(borrowing), dominant_share(queue, state))
