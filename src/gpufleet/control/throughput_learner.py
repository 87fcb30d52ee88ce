"""The loop's throughput learner: measured speeds of job types on GPU models, from what jobs report.

Every `every_s` the loop hands it the jobs that hold resources; it reads the progress history of those that
declare a `job_type` (and once more of each that stopped since, for its last reports), pools them
(`domain/throughput_learning.py`), and merges the result into the table the profile was built with. When
the merged table changes, the loop gives it to its cycles as data (`LoopState.set_throughput`), so the
heterogeneity-aware plugins (`throughput` score, `throughput_fair` order, the round allocator) read measured
speeds for job types nobody imported. Learned from the jobs seen since the control plane started.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.control.resize import ProgressReader
from gpufleet.domain.jobs import JobId
from gpufleet.domain.records import JobRecord
from gpufleet.domain.throughput_learning import TypedProgress, learned_table, merged
from gpufleet.domain.throughput_table import ThroughputTable

LEARN_EVERY_S = 60.0


class ThroughputLearner:
    def __init__(
        self, imported: ThroughputTable | None, progress: ProgressReader, every_s: float = LEARN_EVERY_S
    ) -> None:
        self.imported = imported
        self.progress = progress
        self.every_s = every_s
        self.table: ThroughputTable | None = imported  # what cycles read: imported + learned
        self._next_at: float | None = None
        self._running: dict[JobId, tuple[str, bool]] = {}  # typed jobs holding resources: (type, one worker)
        self._seen: dict[JobId, TypedProgress] = {}  # every typed job's latest history, running or not

    def due(self, now: float) -> bool:
        return self._next_at is None or now >= self._next_at

    def learn(self, now: float, holding: Iterable[JobRecord]) -> ThroughputTable | None:
        """Read the typed jobs' histories; the new table when it differs from the last one, else None."""
        self._next_at = now + self.every_s
        running = {r.id: (r.job.job_type, r.job.workers == 1) for r in holding if r.job.job_type}
        # Jobs that stopped since the last look are read once more, for their final reports.
        for job_id, (job_type, single_worker) in {**self._running, **running}.items():
            history = self.progress.job_progress(job_id)
            if history is not None:
                self._seen[job_id] = TypedProgress(job_type, single_worker, history)
        self._running = running
        table = merged(self.imported, learned_table(self._seen.values()))
        if table == self.table:
            return None
        self.table = table
        return table
