"""Order: highest priority first, then first in, first out."""

from __future__ import annotations

from typing import ClassVar

from gpufleet.domain.jobs import Job
from gpufleet.scheduling.plugins import SortKey
from gpufleet.scheduling.state import CycleState

NAME = "priority"


class Priority:
    name: ClassVar[str] = NAME

    def job_key(self, job: Job, state: CycleState) -> SortKey:
        return (-job.priority, job.submitted_at)

    def queue_key(self, queue: str, state: CycleState) -> SortKey:
        return ()
