"""Order: shortest job first, with known durations (an oracle baseline, as in Helios' and Tiresias' evaluations).

Jobs go by `job.expected_duration`, shortest first, across all queues; jobs without one go after every job
with one, first in, first out among themselves. Non-preemptive: a running job is never reordered (see
`srtf` for the remaining-time variant). The simulator gives jobs their trace durations with
`Workload.with_expected_durations()`.
"""

from __future__ import annotations

from typing import ClassVar

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.plugin_api import ClusterView, SortKey

NAME = "sjf"


class ShortestJobFirst:
    name: ClassVar[str] = NAME

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        if job.expected_duration is None:
            return (1, 0.0, job.submitted_at)
        return (0, job.expected_duration, job.submitted_at)

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        return ()
