"""The SQL store's jobs: submissions, the loop's versioned writes and transitions, users' requests, job
queries and notices.

Submission and request numbers come from counter rows in `meta`, incremented inside the inserting
transaction, not from an autoincrement: the row lock makes each number's transaction commit before the
next number is handed out, so a reader that has seen number n has seen every number below it, and
`take_submissions`/`take_requests` cursors never skip a job that committed late (with a PostgreSQL
sequence, numbers 5 and 6 may commit as 6 then 5, and a cursor at 6 would miss 5 for good).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from gpufleet.adapters.storage import schema as t
from gpufleet.adapters.storage.codec import decode_record, encode_record
from gpufleet.adapters.storage.sql_base import ACTIVE_STATES, CHUNK, QUEUE_NAMES, SqlBase, first_line, names
from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError, UnknownNameError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.records import JobRecord
from gpufleet.ports import Request, RequestKind, StaleWriteError
from gpufleet.ports.admin import JobQuery, Notice

# The loop's and the API's hot paths run these statements, built once: building a statement costs more
# than SQLite takes to run it (about 65 µs against 15 µs for a look-up by key).
_J = t.jobs.c
_SUBMIT_HEAD = sa.select(t.meta.c.value).where(t.meta.c.key == t.SUBMIT_SEQ)
_ADVANCE = (
    sa.update(t.meta)
    .where(t.meta.c.key == sa.bindparam("counter"))
    .values(value=t.meta.c.value + sa.bindparam("by"))
    .returning(t.meta.c.value)
)
# A share lock: a concurrent delete_queue waits for the submit (and then sees its job), or the other way round.
_QUEUE_IN_USE = sa.select(t.queues.c.name).where(t.queues.c.name == sa.bindparam("name")).with_for_update(read=True)
_INSERT_JOB = sa.insert(t.jobs)
_GET = sa.select(_J.record).where(_J.id == sa.bindparam("id"))
_EXISTS = sa.select(_J.id).where(_J.id == sa.bindparam("id"))
_ACTIVE = sa.select(_J.record).where(_J.state.in_(ACTIVE_STATES)).order_by(_J.seq)
_SUBMITTED_AFTER = sa.select(_J.seq, _J.record).where(_J.seq > sa.bindparam("cursor")).order_by(_J.seq)
# Rows locked in id order, so that two writers cannot deadlock.
_LOCK_VERSIONS = (
    sa.select(_J.id, _J.version).where(_J.id.in_(sa.bindparam("ids", expanding=True))).order_by(_J.id).with_for_update()
)
_REPLACE = (
    sa.update(t.jobs)
    .where(_J.id == sa.bindparam("b_id"), _J.version == sa.bindparam("b_expected"))
    .values(
        queue=sa.bindparam("b_queue"),
        name=sa.bindparam("b_name"),
        state=sa.bindparam("b_state"),
        version=sa.bindparam("b_version"),
        record=sa.bindparam("b_record", type_=sa.JSON()),
    )
)
_INSERT_TRANSITIONS = sa.insert(t.transitions)
_T = t.transitions.c
_HISTORY = (
    sa.select(_T.job_id, _T.source, _T.target, _T.reason, _T.at).where(_T.job_id == sa.bindparam("id")).order_by(_T.id)
)
_INSERT_REQUEST = sa.insert(t.requests)
_INSERT_NOTICE = sa.insert(t.notices)
_NOTICES = (
    sa.select(t.notices.c.job_id, t.notices.c.kind, t.notices.c.message, t.notices.c.at)
    .where(t.notices.c.job_id == sa.bindparam("id"))
    .order_by(t.notices.c.id)
)
_REQUESTS_AFTER = sa.select(t.requests).where(t.requests.c.seq > sa.bindparam("cursor")).order_by(t.requests.c.seq)


class JobTables(SqlBase):
    """`jobs`, `transitions`, `requests` and `notices`."""

    # --- StateStore: jobs ---------------------------------------------------------------------------------

    def submit(self, job: Job, at: float) -> JobRecord:
        """Store a new pending job; its `submit_seq` is replaced with the store's next number."""
        bad = [f for f, value in (("id", job.id), ("queue", job.queue), ("name", job.name)) if "\x00" in value]
        if bad:
            raise SpecError(
                f"job {job.id!r}", tuple(FieldProblem(f, "contains a NUL character", "remove it") for f in bad)
            )
        try:
            with self._tx(write=True) as c:
                if c.execute(_QUEUE_IN_USE, {"name": job.queue}).first() is None:
                    known = c.execute(QUEUE_NAMES).scalars().all()
                    raise UnknownNameError(
                        f"queue {job.queue!r} does not exist",
                        f"submit to one of: {names(known)}" if known else "an admin must create a queue first",
                    )
                seq = self._next(c, t.SUBMIT_SEQ)
                record = JobRecord(dataclasses.replace(job, submit_seq=seq), JobState.PENDING, submitted_at=at)
                c.execute(_INSERT_JOB, _job_row(record))
        except sa.exc.IntegrityError:
            if self.get(job.id) is None:
                raise
            raise SpecError(f"job {job.id!r}", (FieldProblem("id", "is taken", "give the job a new id"),)) from None
        return record

    def submit_many(self, jobs: Sequence[Job], at: float) -> list[JobRecord | GpufleetError]:
        """Store several new pending jobs in one transaction (a group commit of concurrent API submits).

        Returns, per job in order, its record or the error that refused it (an unknown queue, a NUL in a
        name). If the batch cannot be written as one (a job id already taken), each job is submitted on its
        own instead, so one bad job never refuses the others."""
        results: list[JobRecord | GpufleetError] = []
        accepted: list[int] = []
        try:
            with self._tx(write=True) as c:
                known = {
                    q: c.execute(_QUEUE_IN_USE, {"name": q}).first() is not None
                    for q in sorted({j.queue for j in jobs})
                }
                queue_names = None
                for index, job in enumerate(jobs):
                    if any("\x00" in value for value in (job.id, job.queue, job.name)):
                        results.append(SpecError(f"job {job.id!r}", (FieldProblem("id", "contains NUL", "remove it"),)))
                    elif not known[job.queue]:
                        if queue_names is None:
                            queue_names = c.execute(QUEUE_NAMES).scalars().all()
                        results.append(
                            UnknownNameError(
                                f"queue {job.queue!r} does not exist",
                                f"submit to one of: {names(queue_names)}"
                                if queue_names
                                else "an admin must create a queue first",
                            )
                        )
                    else:
                        results.append(JobRecord(job, JobState.PENDING, submitted_at=at))  # seq set below
                        accepted.append(index)
                if accepted:
                    last = int(c.execute(_ADVANCE, {"counter": t.SUBMIT_SEQ, "by": len(accepted)}).scalar_one())
                    first = last - len(accepted) + 1
                    for offset, index in enumerate(accepted):
                        job = jobs[index]
                        results[index] = JobRecord(
                            dataclasses.replace(job, submit_seq=first + offset), JobState.PENDING, submitted_at=at
                        )
                    c.execute(_INSERT_JOB, [_job_row(results[i]) for i in accepted])  # type: ignore[arg-type]
        except sa.exc.IntegrityError:
            singles: list[JobRecord | GpufleetError] = []
            for job in jobs:
                try:
                    singles.append(self.submit(job, at))
                except GpufleetError as error:
                    singles.append(error)
            return singles
        return results

    def take_submissions(self, cursor: int) -> tuple[Sequence[JobRecord], int]:
        with self._tx(write=False) as c:
            rows = c.execute(_SUBMITTED_AFTER, {"cursor": cursor}).all()
        if not rows:
            return [], cursor
        return [decode_record(r.record) for r in rows], int(rows[-1].seq)

    def submission_cursor(self) -> int:
        with self._tx(write=False) as c:
            return int(c.execute(_SUBMIT_HEAD).scalar_one())

    def get(self, job_id: JobId) -> JobRecord | None:
        with self._tx(write=False) as c:
            data = c.execute(_GET, {"id": job_id}).scalar()
        return None if data is None else decode_record(data)

    def active(self) -> Sequence[JobRecord]:
        with self._tx(write=False) as c:
            rows = c.execute(_ACTIVE).scalars().all()
        return [decode_record(r) for r in rows]

    def write(self, updates: Sequence[tuple[int, JobRecord]], transitions: Sequence[Transition]) -> None:
        """Replace the records whose stored version is the expected one and append the transitions, all or
        nothing: StaleWriteError (and nothing written) if any version differs or a job is missing."""
        if not updates and not transitions:
            return
        latest: dict[JobId, JobRecord] = {}  # as in memory: each update is checked, the last one per job wins
        for _, record in updates:
            latest[record.id] = record
        try:
            with self._tx(write=True) as c:
                stored = self._lock_versions(c, list(latest))
                for expected, record in updates:
                    if stored.get(record.id) != expected:
                        raise StaleWriteError(
                            f"job {record.id}: expected version {expected}, store has {stored.get(record.id)}"
                        )
                if latest:
                    self._replace(c, [(stored[i], r) for i, r in latest.items()])
                if transitions:
                    c.execute(_INSERT_TRANSITIONS, [_transition_row(tr) for tr in transitions])
        except sa.exc.IntegrityError as error:
            # Only the transitions' foreign key can fail here: a transition of a job the store does not have.
            raise StaleWriteError(f"a transition names a job the store does not have: {first_line(error)}") from None

    @staticmethod
    def _lock_versions(c: sa.Connection, ids: list[JobId]) -> dict[JobId, int]:
        """Stored versions of `ids`, their rows locked."""
        ids.sort()
        stored: dict[JobId, int] = {}
        for start in range(0, len(ids), CHUNK):
            rows = c.execute(_LOCK_VERSIONS, {"ids": ids[start : start + CHUNK]})
            stored.update((row.id, row.version) for row in rows)
        return stored

    @staticmethod
    def _replace(c: sa.Connection, changes: list[tuple[int, JobRecord]]) -> None:
        params = [
            {
                "b_id": r.id,
                "b_expected": expected,
                "b_queue": r.job.queue,
                "b_name": r.job.name,
                "b_state": r.state.value,
                "b_version": r.version,
                "b_record": encode_record(r),
            }
            for expected, r in changes
        ]
        result = c.execute(_REPLACE, params)
        # The rows are locked and checked above; the count is a second check where the driver reports it.
        if result.supports_sane_multi_rowcount() and result.rowcount != len(params):
            raise StaleWriteError(f"{len(params) - result.rowcount} of {len(params)} jobs changed under the write")

    def history(self, job_id: JobId) -> Sequence[Transition]:
        with self._tx(write=False) as c:
            rows = c.execute(_HISTORY, {"id": job_id}).all()
        return tuple(Transition(r.job_id, JobState(r.source), JobState(r.target), r.reason, r.at) for r in rows)

    def request(self, job_id: JobId, kind: RequestKind, reason: str, at: float) -> None:
        """Record a request for the loop. UnknownNameError if the store has no such job."""
        with self._tx(write=True) as c:
            if c.execute(_EXISTS, {"id": job_id}).first() is None:
                raise UnknownNameError(f"job {job_id!r} does not exist", "check the job id (list jobs to see them)")
            seq = self._next(c, t.REQUEST_SEQ)
            c.execute(
                _INSERT_REQUEST,
                {"seq": seq, "job_id": job_id, "kind": RequestKind(kind).value, "reason": reason, "at": at},
            )

    def take_requests(self, cursor: int) -> tuple[Sequence[Request], int]:
        with self._tx(write=False) as c:
            rows = c.execute(_REQUESTS_AFTER, {"cursor": cursor}).all()
        if not rows:
            return [], cursor
        taken = [Request(int(r.seq), r.job_id, RequestKind(r.kind), r.reason, r.at) for r in rows]
        return taken, taken[-1].seq

    # --- AdminStore: job queries and notices -------------------------------------------------------------

    def jobs(self, query: JobQuery) -> Sequence[JobRecord]:
        """Jobs matching every given filter (queue, any of the states, exact name), newest first, at most
        `query.limit`; `before_seq` pages on from the last page's oldest `submit_seq`."""
        if query.limit < 1:
            raise SpecError("job query", (FieldProblem("limit", f"is {query.limit}", "ask for 1 or more jobs"),))
        statement = sa.select(t.jobs.c.record)
        if query.queue is not None:
            statement = statement.where(t.jobs.c.queue == query.queue)
        if query.states:
            statement = statement.where(t.jobs.c.state.in_(sorted(JobState(s).value for s in query.states)))
        if query.name is not None:
            statement = statement.where(t.jobs.c.name == query.name)
        if query.before_seq is not None:
            statement = statement.where(t.jobs.c.seq < query.before_seq)
        with self._tx(write=False) as c:
            rows = c.execute(statement.order_by(t.jobs.c.seq.desc()).limit(query.limit)).scalars().all()
        return [decode_record(r) for r in rows]

    def add_notice(self, notice: Notice) -> None:
        with self._tx(write=True) as c:
            if c.execute(_EXISTS, {"id": notice.job_id}).first() is None:
                raise UnknownNameError(f"job {notice.job_id!r} does not exist", "check the job id")
            c.execute(
                _INSERT_NOTICE,
                {"job_id": notice.job_id, "kind": notice.kind, "message": notice.message, "at": notice.at},
            )

    def notices(self, job_id: JobId) -> Sequence[Notice]:
        with self._tx(write=False) as c:
            rows = c.execute(_NOTICES, {"id": job_id}).all()
        return tuple(Notice(r.job_id, r.kind, r.message, r.at) for r in rows)


def _job_row(record: JobRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "seq": record.job.submit_seq,
        "queue": record.job.queue,
        "name": record.job.name,
        "state": record.state.value,
        "version": record.version,
        "submitted_at": record.submitted_at,
        "record": encode_record(record),
    }


def _transition_row(tr: Transition) -> dict[str, Any]:
    return {"job_id": tr.job_id, "source": tr.source.value, "target": tr.target.value, "reason": tr.reason, "at": tr.at}
