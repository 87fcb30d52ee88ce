"""Order: first in, first out, across all queues."""

from __future__ import annotations

from typing import ClassVar

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.plugin_api import ClusterView, SortKey

NAME = "fifo"


class Fifo:
    name: ClassVar[str] = NAME

    def job_key(self, job: Job, cluster: ClusterView) -> SortKey:
        return (job.submitted_at,)

    def queue_key(self, queue: str, cluster: ClusterView) -> SortKey:
        return ()
