"""A resize policy the test scripts: it asks for the size the test set for each job, and nothing else. For
tests of how resizes are carried out (the loop, the backends, restarts), not of which resizes are chosen."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from gpufleet.domain.jobs import JobId
from gpufleet.scheduling.plugin_api import ResizeInput


@dataclass
class ScriptedResize:
    """`want[job id]`: the GPUs that job should have; a job not listed keeps its size."""

    name: ClassVar[str] = "scripted"
    want: dict[JobId, int] = field(default_factory=dict)

    def resize(self, given: ResizeInput) -> Mapping[JobId, int]:
        return {j.id: self.want[j.id] for j in given.jobs if j.id in self.want and self.want[j.id] != j.gpus}
