"""Order: first in, first out, across all queues."""

from __future__ import annotations

from typing import ClassVar

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.plugins import SortKey
from gpufleet.scheduling.state import CycleState

NAME = "fifo"


class Fifo:
    name: ClassVar[str] = NAME

    def job_key(self, job: Job, state: CycleState) -> SortKey:
        return (job.submitted_at,)

    def queue_key(self, queue: str, state: CycleState) -> SortKey:
        return ()
