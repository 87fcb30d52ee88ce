"""Windows an admin sets on nodes (`gpufleet reservation create`): GPUs held for one queue for a time, or taken out
of service for maintenance, as Slurm's `scontrol create reservation` does.

- **Maintenance** (`queue` None): from `start` to `end` no job runs on the nodes. Before `start`, a job may start
  there only if its run time limit ends it by `start`; running jobs there are stopped with their checkpoint
  signal `grace_s` before `start` and go back to their queue.
- **For a queue**: from `start` to `end` only that queue's jobs run on the nodes; before `start` others may use
  them (backfill) only if they end by `start`, and are stopped before it otherwise. The queue's own jobs may use
  them at any time.

A job's run time limit is its `RunSpec.max_runtime_s`, else its declared `expected_duration` (`run_limit`); a job
with neither is taken to run for ever.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.domain.jobs import Job

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def run_limit(job: Job) -> float | None:
    """How long a run of the job may last: its run time limit, else its declared expected duration (None: no
    limit is known)."""
    if job.run is not None and job.run.max_runtime_s is not None:
        return job.run.max_runtime_s
    return job.expected_duration


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    nodes: tuple[str, ...]
    start: float
    end: float
    queue: str | None = None  # None: maintenance

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if not _NAME.match(self.name):
            problems.append(
                FieldProblem("name", f"{self.name!r} is not a name", "use lower-case letters, digits and '-' (≤ 63)")
            )
        if not self.nodes:
            problems.append(FieldProblem("nodes", "names no node", "give one or more node names"))
        elif len(set(self.nodes)) != len(self.nodes):
            problems.append(FieldProblem("nodes", "names a node twice", "name each node once"))
        if not (math.isfinite(self.start) and math.isfinite(self.end)) or self.end <= self.start:
            problems.append(FieldProblem("end", "is not after the start", "give an end later than the start"))
        if self.queue is not None and not self.queue:
            problems.append(FieldProblem("queue", "is empty", "name the queue, or make it a maintenance window"))
        check(problems, f"reservation {self.name!r}")

    @property
    def maintenance(self) -> bool:
        return self.queue is None

    def over(self, now: float) -> bool:
        return now >= self.end

    def lets(self, job: Job, now: float) -> bool:
        """Whether `job`, started at `now`, may run on the window's nodes."""
        if now >= self.end or job.queue == self.queue:
            return True
        return now < self.start and self.ends_before(job, now)

    def ends_before(self, job: Job, started_at: float) -> bool:
        """Whether a run of `job` started at `started_at` has ended by the window's start (by its limit)."""
        limit = run_limit(job)
        return limit is not None and started_at + limit <= self.start

    def describe(self) -> str:
        what = "maintenance" if self.queue is None else f"held for queue {self.queue}"
        return f"reservation {self.name} ({what}, t={self.start:.0f}..{self.end:.0f})"
