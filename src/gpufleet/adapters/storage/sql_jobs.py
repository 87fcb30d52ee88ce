"""The SQL store's jobs: submissions, the loop's versioned writes and transitions, users' requests, job
queries and notices.

Submission and request numbers come from counter rows in `meta`, incremented inside the inserting
transaction, not from an autoincrement: the row lock makes each number's transaction commit before the
next number is handed out, so a reader that has seen number n has seen every number below it, and
`take_submissions`/`take_requests` cursors never skip a job that committed late (with a PostgreSQL
sequence, numbers 5 and 6 may commit as 6 then 5, and a cursor at 6 would miss 5 for good).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import sqlalchemy as sa

from gpufleet.adapters.storage import schema as t
from gpufleet.adapters.storage.codec import EncodedParts, decode_record, encode_record, encode_record_text
from gpufleet.adapters.storage.sql_base import (
    ACTIVE_STATES,
    CHUNK,
    QUEUE_NAMES,
    DriverRows,
    SqlBase,
    first_line,
    in_listed,
    names,
)
from gpufleet.domain.errors import FieldProblem, GpufleetError, LimitError, SpecError, UnknownNameError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.records import JobRecord
from gpufleet.ports import Request, RequestKind, StaleWriteError
from gpufleet.ports.admin import IDEMPOTENCY_TTL_S, JobOrder, JobQuery, Notice, SubmitKey

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
_QUEUE_IN_USE = sa.select(t.queues.c.spec).where(t.queues.c.name == sa.bindparam("name")).with_for_update(read=True)
_INSERT_JOB = sa.insert(t.jobs)
_GET = sa.select(_J.record).where(_J.id == sa.bindparam("id"))
_EXISTS = sa.select(_J.id).where(_J.id == sa.bindparam("id"))
_ACTIVE = sa.select(_J.record).where(_J.state.in_(ACTIVE_STATES)).order_by(_J.seq)
_SUBMITTED_AFTER = sa.select(_J.seq, _J.record).where(_J.seq > sa.bindparam("cursor")).order_by(_J.seq)
_REPLACED_COLUMNS: dict[str, sa.BindParameter[Any]] = {
    "queue": sa.bindparam("b_queue"),
    "name": sa.bindparam("b_name"),
    "priority": sa.bindparam("b_priority"),
    "username": sa.bindparam("b_username"),
    "state": sa.bindparam("b_state"),
    "version": sa.bindparam("b_version"),
}


def _replace_statement(sqlite_dialect: bool) -> sa.Update:
    """The loop's rewrite of a job's row, its record bound as the JSON text `encode_record_text` made (no
    serialiser runs per row): stored as it is by SQLite, cast to JSON by PostgreSQL."""
    text = sa.bindparam("b_record", type_=sa.Text())
    return (
        sa.update(t.jobs)
        .where(_J.id == sa.bindparam("b_id"), _J.version == sa.bindparam("b_expected"))
        .values(**_REPLACED_COLUMNS, record=text if sqlite_dialect else sa.cast(text, sa.JSON()))
    )


# Columns a job's rewrite sets only where they differ: the job's queue, name, priority and submitter. SQLite
# rewrites the entries of every index on a column an UPDATE sets, changed or not (PostgreSQL compares values).
_KEPT_COLUMNS = ("queue", "name", "priority", "username")


def _replace_state_statement() -> sa.Update:
    """`_replace_statement` for SQLite rows that already hold the job's queue, name, priority and submitter
    (the usual case: they never change while the loop moves a job): it sets the state, version and record only,
    so only the indexes on the state are rewritten. A row that differs in one of them is not matched."""
    kept = [getattr(_J, name) == _REPLACED_COLUMNS[name] for name in _KEPT_COLUMNS]
    return (
        sa.update(t.jobs)
        .where(_J.id == sa.bindparam("b_id"), _J.version == sa.bindparam("b_expected"), *kept)
        .values(
            state=_REPLACED_COLUMNS["state"],
            version=_REPLACED_COLUMNS["version"],
            record=sa.bindparam("b_record", type_=sa.Text()),
        )
    )


_INSERT_TRANSITIONS = sa.insert(t.transitions).values(
    {name: sa.bindparam(name) for name in ("job_id", "source", "target", "reason", "at")}
)
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
_K = t.idempotency_keys.c
_KEYS_OF_TOKEN = sa.select(_K.key, _K.body_hash, _K.job_id, _K.created_at).where(
    _K.token_id == sa.bindparam("token"), _K.key.in_(sa.bindparam("keys", expanding=True))
)
_DELETE_KEY = sa.delete(t.idempotency_keys).where(_K.token_id == sa.bindparam("token"), _K.key == sa.bindparam("key"))
_INSERT_KEYS = sa.insert(t.idempotency_keys)
_PENDING_IN_QUEUE = (
    sa.select(sa.func.count()).select_from(t.jobs).where(_J.queue == sa.bindparam("queue"), _J.state == "pending")
)
_REQUESTS_AFTER = sa.select(t.requests).where(t.requests.c.seq > sa.bindparam("cursor")).order_by(t.requests.c.seq)


class _UnmatchedRowsError(Exception):
    """A rewrite matched fewer rows than it had updates: some job is missing or not at its expected version."""


class JobTables(SqlBase):
    """`jobs`, `transitions`, `requests` and `notices`."""

    def __init__(self, engine: sa.Engine, url: str) -> None:
        super().__init__(engine, url)
        self._encoded_parts = EncodedParts()  # the loop rewrites the same jobs' records step after step
        # Rows locked in id order, so that two writers cannot deadlock.
        self._lock_versions_of = (
            sa.select(_J.id, _J.version)
            .where(in_listed(_J.id, "ids", sqlite_dialect=self._sqlite))
            .order_by(_J.id)
            .with_for_update()
        )
        # SQLite, whose driver reports how many rows an executemany changed: a write checks versions by that count.
        self._counted_writes = self._sqlite and engine.dialect.supports_sane_multi_rowcount
        self._versions_of = sa.select(_J.id, _J.version).where(in_listed(_J.id, "ids", sqlite_dialect=self._sqlite))
        self._replace_rows = DriverRows(_replace_statement(self._sqlite), engine.dialect)
        self._replace_state_rows = DriverRows(_replace_state_statement(), engine.dialect) if self._sqlite else None
        self._insert_transitions = DriverRows(_INSERT_TRANSITIONS, engine.dialect)

    # --- StateStore: jobs ---------------------------------------------------------------------------------

    def submit(self, job: Job, at: float) -> JobRecord:
        """Store a new pending job; its `submit_seq` is replaced with the store's next number."""
        bad = [f for f, value in (("id", job.id), ("queue", job.queue), ("name", job.name)) if "\x00" in value]
        if bad:
            raise SpecError(
                f"job {job.id!r}", tuple(FieldProblem(f, "contains a NUL character", "remove it") for f in bad)
            )
        result = self._submit_one(job, None, at, IDEMPOTENCY_TTL_S)
        if isinstance(result, GpufleetError):
            raise result
        return result

    def submit_many(
        self,
        jobs: Sequence[Job],
        at: float,
        keys: Sequence[SubmitKey | None] | None = None,
        key_ttl_s: float = IDEMPOTENCY_TTL_S,
    ) -> list[JobRecord | GpufleetError]:
        """Store several new pending jobs in one transaction (a group commit of concurrent API submits).

        Returns, per job in order, its record or the error that refused it (an unknown queue, a NUL in a
        name, its queue's `max_pending` reached, an idempotency key reused with another body). A job whose
        idempotency key was used less than `key_ttl_s` ago gets the job that key made (another id). If the
        batch cannot be written as one (a job id already taken), each job is submitted on its own instead,
        so one bad job never refuses the others."""
        given = list(keys) if keys is not None else [None] * len(jobs)
        try:
            with self._tx(write=True) as c:
                return self._store(c, jobs, given, at, key_ttl_s)
        except sa.exc.IntegrityError:
            return [self._submit_one(job, key, at, key_ttl_s) for job, key in zip(jobs, given, strict=True)]

    def _submit_one(self, job: Job, key: SubmitKey | None, at: float, key_ttl_s: float) -> JobRecord | GpufleetError:
        for _ in range(2):  # a second try sees a key another process stored meanwhile
            try:
                with self._tx(write=True) as c:
                    return self._store(c, [job], [key], at, key_ttl_s)[0]
            except sa.exc.IntegrityError:
                if self.get(job.id) is not None:
                    return SpecError(f"job {job.id!r}", (FieldProblem("id", "is taken", "give the job a new id"),))
        raise StaleWriteError(f"job {job.id!r}: its idempotency key kept clashing with another writer's")

    def _store(
        self, c: sa.Connection, jobs: Sequence[Job], keys: Sequence[SubmitKey | None], at: float, key_ttl_s: float
    ) -> list[JobRecord | GpufleetError]:
        """Check and insert `jobs` (one batch) inside the transaction `c`."""
        specs = {q: c.execute(_QUEUE_IN_USE, {"name": q}).scalar() for q in sorted({j.queue for j in jobs})}
        room: dict[str, int | None] = {}
        stored_keys, expired = _stored_keys(c, [k for k in keys if k is not None], at - key_ttl_s)
        batch_keys: dict[tuple[str, str], tuple[str, int]] = {}  # (token, key) -> body hash, first job's index
        replays: dict[int, str | int] = {}  # index -> the job id a stored key made, or the batch index that did
        results: list[JobRecord | GpufleetError] = []
        accepted: list[int] = []
        queue_names = None
        for index, (job, key) in enumerate(zip(jobs, keys, strict=True)):
            pair = (key.token_id, key.key) if key is not None else None
            if any("\x00" in value for value in (job.id, job.queue, job.name)):
                results.append(SpecError(f"job {job.id!r}", (FieldProblem("id", "contains NUL", "remove it"),)))
                continue
            if specs[job.queue] is None:
                if queue_names is None:
                    queue_names = c.execute(QUEUE_NAMES).scalars().all()
                fix = f"submit to one of: {names(queue_names)}" if queue_names else "an admin must create a queue first"
                results.append(UnknownNameError(f"queue {job.queue!r} does not exist", fix))
                continue
            if key is not None and pair is not None:
                earlier = stored_keys.get(pair) or batch_keys.get(pair)
                if earlier is not None:
                    body_hash, made = earlier
                    if body_hash != key.body_hash:
                        results.append(_key_reused(key))
                    else:
                        results.append(JobRecord(job, JobState.PENDING))  # replaced below
                        replays[index] = made
                    continue
            if job.queue not in room:
                room[job.queue] = _pending_room(c, job.queue, specs[job.queue])
            left = room[job.queue]
            if left is not None and left <= 0:
                results.append(_queue_full(job.queue, specs[job.queue]))
                continue
            if left is not None:
                room[job.queue] = left - 1
            if pair is not None and key is not None:
                batch_keys[pair] = (key.body_hash, index)
            results.append(JobRecord(job, JobState.PENDING, submitted_at=at))  # seq set below
            accepted.append(index)
        if accepted:
            last = int(c.execute(_ADVANCE, {"counter": t.SUBMIT_SEQ, "by": len(accepted)}).scalar_one())
            first = last - len(accepted) + 1
            for offset, index in enumerate(accepted):
                results[index] = JobRecord(jobs[index].numbered(first + offset), JobState.PENDING, submitted_at=at)
            c.execute(_INSERT_JOB, [_job_row(results[i]) for i in accepted])  # type: ignore[arg-type]
            new_keys = [(keys[i], results[i]) for i in accepted if keys[i] is not None]
            if new_keys:
                _insert_keys(c, new_keys, expired, at)
        for index, made in replays.items():
            if isinstance(made, int):
                results[index] = results[made]
            else:
                data = c.execute(_GET, {"id": made}).scalar_one()
                results[index] = decode_record(data)
        return results

    def take_submissions(self, cursor: int) -> tuple[Sequence[JobRecord], int]:
        with self._tx(write=False) as c:
            rows = c.execute(_SUBMITTED_AFTER, {"cursor": cursor}).all()
        if not rows:
            return [], cursor
        read = self._encoded_parts.read_record  # the loop writes these records next: their jobs' encodings kept
        return [read(r.record) for r in rows], int(rows[-1].seq)

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
                if self._counted_writes and len(latest) == len(updates):
                    # SQLite: BEGIN IMMEDIATE made this the only writer and each job is rewritten once, so the
                    # rewrite's own test of the expected version checks every row: no read first. A row it did
                    # not match rolls the write back, then is named from a read.
                    if self._replace(c, list(updates)) != len(updates):
                        raise _UnmatchedRowsError
                else:
                    stored = self._lock_versions(c, list(latest))
                    for expected, record in updates:
                        if stored.get(record.id) != expected:
                            raise StaleWriteError(
                                f"job {record.id}: expected version {expected}, store has {stored.get(record.id)}"
                            )
                    if latest:
                        changes = [(stored[i], r) for i, r in latest.items()]
                        replaced = self._replace(c, changes)
                        # The rows are locked and checked above; the count is a second check where the driver
                        # reports it.
                        if replaced is not None and replaced != len(changes):
                            missing = len(changes) - replaced
                            raise StaleWriteError(f"{missing} of {len(changes)} jobs changed under the write")
                if transitions:
                    self._insert_transitions.run(c, [_transition_row(tr) for tr in transitions])
                    self._charge_started(c, latest, transitions)
                    self._record_losses(c, latest, transitions)
        except sa.exc.IntegrityError as error:
            # Only the transitions' foreign key can fail here: a transition of a job the store does not have.
            raise StaleWriteError(f"a transition names a job the store does not have: {first_line(error)}") from None
        except _UnmatchedRowsError:
            self._raise_stale(updates)

    def _raise_stale(self, updates: Sequence[tuple[int, JobRecord]]) -> NoReturn:
        """StaleWriteError naming the first update whose job is missing or not at its expected version, read after
        the write was rolled back (another writer may have moved a job since: the error stands, named or not)."""
        with self._tx(write=False) as c:
            ids = self._listed(sorted(record.id for _, record in updates))
            stored = {row.id: row.version for row in c.execute(self._versions_of, {"ids": ids})}
        for expected, record in updates:
            if stored.get(record.id) != expected:
                found = stored.get(record.id)
                raise StaleWriteError(f"job {record.id}: expected version {expected}, store has {found}")
        raise StaleWriteError(f"{len(updates)} jobs changed under the write")

    def _lock_versions(self, c: sa.Connection, ids: list[JobId]) -> dict[JobId, int]:
        """Stored versions of `ids`, their rows locked."""
        rows = c.execute(self._lock_versions_of, {"ids": self._listed(sorted(ids))})
        return {row.id: row.version for row in rows}

    def _replace(self, c: sa.Connection, changes: list[tuple[int, JobRecord]]) -> int | None:
        """Rewrite each job's row that is at the expected version; how many were, where the driver tells."""
        if not changes:
            return 0
        parts = self._encoded_parts
        params = [
            {
                "b_id": r.id,
                "b_expected": expected,
                "b_queue": r.job.queue,
                "b_name": r.job.name,
                "b_priority": r.job.priority,
                "b_username": r.job.user,
                "b_state": r.state.value,
                "b_version": r.version,
                "b_record": encode_record_text(r, parts),
            }
            for expected, r in changes
        ]
        replaced = 0
        narrow = self._replace_state_rows
        if narrow is not None and all(r.version != expected for expected, r in changes):
            # Rows that hold the job's other columns already take the state, version and record alone; the full
            # rewrite below then matches only the others (a row rewritten here no longer has the expected
            # version). Where every row was, it is not run.
            result = narrow.run(c, params)
            if result.supports_sane_multi_rowcount():
                replaced = result.rowcount
                if replaced == len(params):
                    return replaced
        result = self._replace_rows.run(c, params)
        if not result.supports_sane_multi_rowcount():
            return None
        return replaced + result.rowcount

    def history(self, job_id: JobId) -> Sequence[Transition]:
        with self._tx(write=False) as c:
            rows = c.execute(_HISTORY, {"id": job_id}).all()
        return tuple(Transition(r.job_id, JobState(r.source), JobState(r.target), r.reason, r.at) for r in rows)

    def request(self, job_id: JobId, kind: RequestKind, reason: str, at: float, value: float | None = None) -> None:
        """Record a request for the loop. UnknownNameError if the store has no such job."""
        with self._tx(write=True) as c:
            if c.execute(_EXISTS, {"id": job_id}).first() is None:
                raise UnknownNameError(f"job {job_id!r} does not exist", "check the job id (list jobs to see them)")
            seq = self._next(c, t.REQUEST_SEQ)
            c.execute(
                _INSERT_REQUEST,
                {
                    "seq": seq,
                    "job_id": job_id,
                    "kind": RequestKind(kind).value,
                    "reason": reason,
                    "at": at,
                    "value": value,
                },
            )

    def request_many(self, items: Sequence[tuple[JobId, RequestKind, str]], at: float) -> None:
        """Record requests for many jobs in one transaction (a bulk cancel of a 10,000-task array); the jobs
        were read from this store, so they exist."""
        if not items:
            return
        with self._tx(write=True) as c:
            last = int(c.execute(_ADVANCE, {"counter": t.REQUEST_SEQ, "by": len(items)}).scalar_one())
            first = last - len(items) + 1
            rows = [
                {
                    "seq": first + n,
                    "job_id": job_id,
                    "kind": RequestKind(kind).value,
                    "reason": why,
                    "at": at,
                    "value": None,
                }
                for n, (job_id, kind, why) in enumerate(items)
            ]
            c.execute(_INSERT_REQUEST, rows)

    def take_requests(self, cursor: int) -> tuple[Sequence[Request], int]:
        with self._tx(write=False) as c:
            rows = c.execute(_REQUESTS_AFTER, {"cursor": cursor}).all()
        if not rows:
            return [], cursor
        taken = [Request(int(r.seq), r.job_id, RequestKind(r.kind), r.reason, r.at, r.value) for r in rows]
        return taken, taken[-1].seq

    # --- AdminStore: job queries and notices -------------------------------------------------------------

    def jobs(self, query: JobQuery) -> Sequence[JobRecord]:
        """Jobs matching every given filter (queue, any of the states, exact name, submitter, part of the
        name), in the query's order (newest first by default), at most `query.limit` after skipping
        `query.offset`; `before_seq` pages on from the last page's oldest `submit_seq`."""
        problems = []
        if query.limit < 1:
            problems.append(FieldProblem("limit", f"is {query.limit}", "ask for 1 or more jobs"))
        if query.offset < 0:
            problems.append(FieldProblem("offset", f"is {query.offset}", "give 0 or more"))
        if problems:
            raise SpecError("job query", tuple(problems))
        key = _ORDER_COLUMNS[JobOrder(query.order)]
        seq = t.jobs.c.seq.asc() if query.ascending else t.jobs.c.seq.desc()
        ordering = [seq] if key is None else [key.asc() if query.ascending else key.desc(), seq]
        statement = _filtered(sa.select(t.jobs.c.record), query).order_by(*ordering)
        statement = statement.limit(query.limit).offset(query.offset or None)
        with self._tx(write=False) as c:
            rows = c.execute(statement).scalars().all()
        return [decode_record(r) for r in rows]

    def count_jobs(self, query: JobQuery) -> int:
        statement = _filtered(sa.select(sa.func.count()).select_from(t.jobs), query)
        with self._tx(write=False) as c:
            return int(c.execute(statement).scalar_one())

    def pending_ahead(self, queue: str, priority: int, submit_seq: int, limit: int) -> tuple[int, list[str]]:
        # Counted on an index: a queue of many thousand waiting jobs is not decoded to rank one of them.
        prio = t.jobs.c.priority
        ahead = sa.and_(
            t.jobs.c.queue == queue,
            t.jobs.c.state == JobState.PENDING.value,
            sa.or_(prio > priority, sa.and_(prio == priority, t.jobs.c.seq < submit_seq)),
        )
        with self._tx(write=False) as c:
            count = int(c.execute(sa.select(sa.func.count()).select_from(t.jobs).where(ahead)).scalar_one())
            first = c.execute(
                sa.select(t.jobs.c.id).where(ahead).order_by(prio.desc(), t.jobs.c.seq.asc()).limit(limit)
            ).scalars()
            return count, [str(job_id) for job_id in first]

    def add_notice(self, notice: Notice) -> None:
        with self._tx(write=True) as c:
            if c.execute(_EXISTS, {"id": notice.job_id}).first() is None:
                raise UnknownNameError(f"job {notice.job_id!r} does not exist", "check the job id")
            c.execute(
                _INSERT_NOTICE,
                {"job_id": notice.job_id, "kind": notice.kind, "message": notice.message, "at": notice.at},
            )

    def forget_idempotency_keys(self, before: float) -> int:
        """Drop the idempotency keys made before `before`; returns how many."""
        with self._tx(write=True) as c:
            return int(c.execute(sa.delete(t.idempotency_keys).where(_K.created_at < before)).rowcount)

    def notices(self, job_id: JobId) -> Sequence[Notice]:
        with self._tx(write=False) as c:
            rows = c.execute(_NOTICES, {"id": job_id}).all()
        return tuple(Notice(r.job_id, r.kind, r.message, r.at) for r in rows)


# --- job queries -------------------------------------------------------------------------------------------


_ORDER_COLUMNS: dict[JobOrder, Any] = {
    JobOrder.SUBMITTED: None,
    JobOrder.NAME: t.jobs.c.name,
    JobOrder.QUEUE: t.jobs.c.queue,
    JobOrder.STATE: t.jobs.c.state,
    JobOrder.USER: t.jobs.c.username,
}


def _filtered(statement: Any, query: JobQuery) -> Any:
    if query.queue is not None:
        statement = statement.where(t.jobs.c.queue == query.queue)
    if query.states:
        statement = statement.where(t.jobs.c.state.in_(sorted(JobState(s).value for s in query.states)))
    if query.name is not None:
        statement = statement.where(t.jobs.c.name == query.name)
    if query.name_contains:
        statement = statement.where(t.jobs.c.name.icontains(query.name_contains, autoescape=True))
    if query.user is not None:
        statement = statement.where(t.jobs.c.username == query.user)
    if query.array_id is not None:
        statement = statement.where(t.jobs.c.array_id == query.array_id)
    if query.before_seq is not None:
        statement = statement.where(t.jobs.c.seq < query.before_seq)
    return statement


# --- rows ----------------------------------------------------------------------------------------------------


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
        "priority": record.job.priority,
        "username": record.job.user,
        "array_id": record.job.array.array_id if record.job.array is not None else "",
    }


def _transition_row(tr: Transition) -> dict[str, Any]:
    return {"job_id": tr.job_id, "source": tr.source.value, "target": tr.target.value, "reason": tr.reason, "at": tr.at}


def _stored_keys(
    c: sa.Connection, keys: Sequence[SubmitKey], since: float
) -> tuple[dict[tuple[str, str], tuple[str, str]], set[tuple[str, str]]]:
    """The stored keys among `keys`: those made at or after `since`, (token, key) -> (body hash, job id); and
    those made before it (expired: the new job replaces them). One look-up per token, on the primary key."""
    wanted: dict[str, set[str]] = {}
    for key in keys:
        wanted.setdefault(key.token_id, set()).add(key.key)
    found: dict[tuple[str, str], tuple[str, str]] = {}
    expired: set[tuple[str, str]] = set()
    for token_id, token_keys in sorted(wanted.items()):
        listed = sorted(token_keys)
        for start in range(0, len(listed), CHUNK):
            rows = c.execute(_KEYS_OF_TOKEN, {"token": token_id, "keys": listed[start : start + CHUNK]})
            for row in rows:
                if row.created_at >= since:
                    found[(token_id, row.key)] = (row.body_hash, row.job_id)
                else:
                    expired.add((token_id, row.key))
    return found, expired


def _insert_keys(
    c: sa.Connection,
    made: Sequence[tuple[SubmitKey | None, JobRecord | GpufleetError]],
    expired: set[tuple[str, str]],
    at: float,
) -> None:
    rows = [
        {"token_id": k.token_id, "key": k.key, "body_hash": k.body_hash, "job_id": r.id, "created_at": at}
        for k, r in made
        if k is not None and isinstance(r, JobRecord)
    ]
    # An expired key of the same name is replaced: the new job is what it names from now on.
    gone = [{"token": r["token_id"], "key": r["key"]} for r in rows if (r["token_id"], r["key"]) in expired]
    if gone:
        c.execute(_DELETE_KEY, gone)
    c.execute(_INSERT_KEYS, rows)


def _pending_room(c: sa.Connection, queue: str, spec: Mapping[str, Any] | None) -> int | None:
    """How many more jobs the queue may have pending (None: no cap)."""
    cap = None if spec is None else spec.get("max_pending")
    if cap is None:
        return None
    return int(cap) - int(c.execute(_PENDING_IN_QUEUE, {"queue": queue}).scalar_one())


def _queue_full(queue: str, spec: Mapping[str, Any] | None) -> LimitError:
    cap = None if spec is None else spec.get("max_pending")
    return LimitError(
        f"queue {queue!r} already has {cap} pending jobs, the most its admin allows",
        f"wait until some of them start or cancel some; an admin may raise the cap with "
        f"`gpufleet quota set {queue} --max-pending N`",
    )


def _key_reused(key: SubmitKey) -> SpecError:
    return SpecError(
        "request",
        (
            FieldProblem(
                "Idempotency-Key",
                f"{key.key!r} was used before with a different request body",
                "send a new key for a new job; reuse a key only to retry exactly the same request",
            ),
        ),
    )
