"""The SQL store's progress histories: what each job reported about itself (`domain/progress.py`)."""

from __future__ import annotations

import json
from collections.abc import Callable

import sqlalchemy as sa

from gpufleet.adapters.storage import schema as t
from gpufleet.adapters.storage.sql_base import SqlBase
from gpufleet.domain.progress import JobProgress, progress_from_dict, progress_to_dict

_P = t.job_progress


class ProgressTables(SqlBase):
    """`job_progress`."""

    def job_progress(self, job_id: str) -> JobProgress | None:
        """The job's history, or None if it never reported."""
        with self._tx(write=False) as c:
            value = c.execute(sa.select(_P.c.value).where(_P.c.job_id == job_id)).scalar()
        return None if value is None else progress_from_dict(json.loads(value))

    def update_progress(self, job_id: str, now: float, update: Callable[[JobProgress], JobProgress]) -> JobProgress:
        """Apply `update` to the job's history (an empty one if it has none) in one transaction; return the
        result. Concurrent updates of one job are serialised (SQLite: one writer; PostgreSQL: the row lock)."""
        with self._tx(write=True) as c:
            value = c.execute(sa.select(_P.c.value).where(_P.c.job_id == job_id).with_for_update()).scalar()
            before = JobProgress() if value is None else progress_from_dict(json.loads(value))
            after = update(before)
            row = {"job_id": job_id, "updated_at": now, "value": json.dumps(progress_to_dict(after))}
            self._upsert(c, _P, row)
        return after
