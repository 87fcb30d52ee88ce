"""Order: least attained service, discretised (Tiresias 2D-LAS, Gu et al., NSDI 2019).

Jobs are put in bands by the GPU-time they have already received; lower bands go first and jobs
within a band go FIFO, so short jobs finish fast without knowing durations and long ones are not
reordered on every small difference. Thresholds in GPU-seconds; Tiresias used a few GPU-hours.
"""

from __future__ import annotations

import bisect
from typing import ClassVar

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.plugin_api import ClusterView, SortKey

NAME = "las"
DEFAULT_THRESHOLDS: tuple[float, ...] = (3_600.0, 10 * 3_600.0)


class LeastAttainedService:
    name: ClassVar[str] = NAME

    def __init__(self, thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS) -> None:
        self.thresholds = tuple(sorted(thresholds))

    def band(self, job: Job) -> int:
        return self.band_of(job.attained_gpu_seconds)

    def band_of(self, attained_gpu_seconds: float) -> int:
        return bisect.bisect_right(self.thresholds, attained_gpu_seconds)

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        return (self.band(job), -job.priority, job.submitted_at)

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        return ()
