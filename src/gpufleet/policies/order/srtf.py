"""Order: shortest remaining time first, with known durations (the preemptive variant of `sjf`, by order).

Remaining time = `expected_duration - attained_gpu_seconds / GPUs`, where GPUs is the job's GPU total
(`gpu_milli_total / 1000`: all workers, fractions counted as such): attained GPU-seconds over the GPUs the
job holds is the wall time it has run. So a job that was preempted and is pending again goes by what it still
has to run, not by its full length. CPU-only jobs accrue no GPU-seconds: their remaining time is their
duration. Jobs without a duration go last, FIFO. Remaining time is clipped at 0.

What it is not: the order plugin only orders pending jobs. Stopping a running job because a shorter one
arrived needs a preemption plugin that compares remaining times; the `priority` preemption plugin compares
priorities and quotas only, so profiles using `srtf` run without preemption. Elastic jobs are counted at their
full worker count, which overestimates their remaining time while they run with fewer workers.
"""

from __future__ import annotations

from typing import ClassVar

from gpufleet.domain.jobs import Job
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.scheduling.plugin_api import ClusterView, SortKey

NAME = "srtf"


def remaining_seconds(job: Job) -> float | None:
    """Expected run time left, or None when the job has no expected duration."""
    if job.expected_duration is None:
        return None
    gpus = job.gpu_milli_total / MILLI_PER_GPU
    ran = job.attained_gpu_seconds / gpus if gpus else 0.0
    return max(0.0, job.expected_duration - ran)


class ShortestRemainingTime:
    name: ClassVar[str] = NAME

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        remaining = remaining_seconds(job)
        if remaining is None:
            return (1, 0.0, job.submitted_at)
        return (0, remaining, job.submitted_at)

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        return ()
