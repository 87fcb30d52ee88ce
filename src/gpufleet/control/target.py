"""FGD's target workload for a live cluster, learned from the jobs submitted to it.

FGD scores a node by how much a placement fragments the GPUs for the *target workload*, the mix of requests
the cluster expects. The paper builds it from the trace being scheduled (`TargetWorkload.from_requests`);
a live control plane has no trace, but it has the jobs its users submitted. At start it reads the most
recent ones (each worker counts as one request, as each is one pod in the paper) and keeps their typical
classes; with too few, the generic openb-like mix (`GENERIC_TARGET`) stands in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.fragmentation import GENERIC_TARGET, TargetWorkload

RECENT_JOBS = 5_000  # the submitted jobs read at start, newest first
MIN_WORKERS = 200  # fewer workers than this say too little about the mix: the generic target is used


@dataclass(frozen=True, slots=True)
class LearnedTarget:
    """The target to schedule with, and where it came from, in words (for logs and the API)."""

    target: TargetWorkload
    source: str


def learned_target(jobs: Sequence[Job], *, minimum: int = MIN_WORKERS) -> LearnedTarget:
    """The typical request classes of `jobs`' workers, or the generic target when there are fewer than
    `minimum` workers."""
    requests = [job.request for job in jobs for _ in range(job.workers)]
    if len(requests) < max(minimum, 1):
        return LearnedTarget(
            GENERIC_TARGET, f"generic (openb-like mix): {len(requests)} submitted workers, fewer than {minimum}"
        )
    target = TargetWorkload.from_requests(requests)
    return LearnedTarget(
        target,
        f"learned from the last {len(jobs):,} submitted jobs ({len(requests):,} workers, "
        f"{len(target.classes)} classes)",
    )
