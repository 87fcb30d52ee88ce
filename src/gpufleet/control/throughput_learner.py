"""The loop's throughput learner: measured speeds of job types on GPU models, from what jobs report.

Every `every_s` the loop hands it the jobs that hold resources; it reads the progress history of those that
declare a `job_type` (and once more of each that stopped since, for its last reports), pools them
(`domain/throughput_learning.py`), and merges the result into the table the profile was built with. When
the merged table changes, the loop gives it to its cycles as data (`LoopState.set_throughput`), so the
heterogeneity-aware plugins (`throughput` score, `throughput_fair` order, the round allocator) read measured
speeds for job types nobody imported.

A job that ended (succeeded, failed, cancelled) runs no more, so what it did is added to pooled sums and its
history is let go; a store that keeps settings keeps those sums (`LEARNED_SETTING`), and a restarted control
plane starts from them. A stopped job that will run again (preempted, requeued) keeps its history in memory
until it ends; after a restart it is read again when it next runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from gpufleet.control.resize import ProgressReader
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import JobId
from gpufleet.domain.records import JobRecord
from gpufleet.domain.throughput_learning import (
    Key,
    Pooled,
    TypedProgress,
    learned_table,
    merged,
    pooled_from_json,
    pooled_measurements,
    pooled_to_json,
)
from gpufleet.domain.throughput_table import ThroughputTable
from gpufleet.ports import StateStore

LEARN_EVERY_S = 60.0
LEARNED_SETTING = "learned_throughput"  # the pooled sums of the jobs that ended

log = logging.getLogger("gpufleet.throughput")


@runtime_checkable
class SettingsStore(Protocol):
    """A store that keeps named settings (the SQL store)."""

    def get_setting(self, key: str) -> str | None: ...

    def set_setting(self, key: str, value: str) -> None: ...


class ThroughputLearner:
    def __init__(
        self,
        imported: ThroughputTable | None,
        progress: ProgressReader,
        job_of: Callable[[JobId], JobRecord | None],
        every_s: float = LEARN_EVERY_S,
        settings: SettingsStore | None = None,
    ) -> None:
        self.imported = imported
        self.progress = progress
        self.job_of = job_of
        self.every_s = every_s
        self.settings = settings
        self._next_at: float | None = None
        self._running: dict[JobId, tuple[str, bool]] = {}  # typed jobs holding resources: (type, one worker)
        self._unended: dict[JobId, TypedProgress] = {}  # latest history of typed jobs that ran and have not ended
        self._ended = self._load()  # pooled sums of what typed jobs that ended did
        self._unsaved = False
        self.table: ThroughputTable | None = merged(imported, learned_table((), self._ended))

    @classmethod
    def of_store(
        cls, imported: ThroughputTable | None, store: StateStore, every_s: float | None
    ) -> ThroughputLearner | None:
        """The loop's learner: None when learning is off or the store keeps no progress reports."""
        if every_s is None or not isinstance(store, ProgressReader):
            return None
        return cls(imported, store, store.get, every_s, store if isinstance(store, SettingsStore) else None)

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
                self._unended[job_id] = TypedProgress(job_type, single_worker, history)
        stopped = [job_id for job_id in self._running if job_id not in running]
        self._running = running
        self._retire(stopped)
        table = merged(self.imported, learned_table(self._unended.values(), self._ended))
        if table == self.table:
            return None
        self.table = table
        return table

    def _retire(self, stopped: Iterable[JobId]) -> None:
        ended = []
        for job_id in stopped:
            record = self.job_of(job_id)
            if record is None or record.state.terminal:
                ended.append(job_id)
        if ended:
            self._ended = pooled_measurements((self._unended.pop(j) for j in ended if j in self._unended), self._ended)
            self._unsaved = True
        if self._unsaved and self.settings is not None:
            # A failed write leaves the sums in memory, marked unsaved: the next look writes them again.
            self.settings.set_setting(LEARNED_SETTING, pooled_to_json(self._ended))
            self._unsaved = False

    def _load(self) -> dict[Key, Pooled]:
        stored = self.settings.get_setting(LEARNED_SETTING) if self.settings is not None else None
        if stored is None:
            return {}
        try:
            return pooled_from_json(stored)
        except GpufleetError as error:
            log.warning("%s; learning again from the start", error)
            return {}
