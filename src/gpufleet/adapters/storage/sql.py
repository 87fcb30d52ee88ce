"""The durable store of the control plane, on SQLite or PostgreSQL: `StateStore` for the loop and
`AdminStore` for the API.

Every method is one short transaction (engine settings in `engine.py`, tables in `schema.py`, JSON in
`codec.py`). Semantics follow `InMemoryStore`, plus the checks a shared store needs: a submit to an
unknown queue is refused, a request for an unknown job too.

Submission and request numbers come from counter rows in `meta`, incremented inside the inserting
transaction, not from an autoincrement: the row lock makes each number's transaction commit before the
next number is handed out, so a reader that has seen number n has seen every number below it, and
`take_submissions`/`take_requests` cursors never skip a job that committed late (with a PostgreSQL
sequence, numbers 5 and 6 may commit as 6 then 5, and a cursor at 6 would miss 5 for good).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from gpufleet.adapters.storage import schema as t
from gpufleet.adapters.storage.codec import (
    decode_node,
    decode_queue,
    decode_record,
    encode_node,
    encode_queue,
    encode_record,
)
from gpufleet.adapters.storage.sql_engine import (
    READ_ONLY,
    StoreUnavailableError,
    make_engine,
    migrate,
    parse_url,
    safe_url,
)
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError, UnknownNameError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import TERMINAL, JobState, Transition
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.records import JobRecord
from gpufleet.ports import Request, RequestKind, StaleWriteError
from gpufleet.ports.admin import AdminStore, JobQuery, Notice, Role, Token

ACTIVE_STATES = tuple(s.value for s in JobState if s not in TERMINAL)
_CHUNK = 500  # ids per IN (...) list, well under SQLite's limit on bound parameters
_LISTED = 20  # names listed in an error message at most


# The loop's and the API's hot paths run these statements, built once: building a statement costs more
# than SQLite takes to run it (about 65 µs against 15 µs for a look-up by key).
_J = t.jobs.c
_CLUSTER_VERSION = sa.select(t.meta.c.value).where(t.meta.c.key == t.CLUSTER_VERSION)
_SUBMIT_HEAD = sa.select(t.meta.c.value).where(t.meta.c.key == t.SUBMIT_SEQ)
_BUMP_CLUSTER_VERSION = sa.update(t.meta).where(t.meta.c.key == t.CLUSTER_VERSION).values(value=t.meta.c.value + 1)
_NEXT = (
    sa.update(t.meta)
    .where(t.meta.c.key == sa.bindparam("counter"))
    .values(value=t.meta.c.value + 1)
    .returning(t.meta.c.value)
)
_ADVANCE = (
    sa.update(t.meta)
    .where(t.meta.c.key == sa.bindparam("counter"))
    .values(value=t.meta.c.value + sa.bindparam("by"))
    .returning(t.meta.c.value)
)
_QUEUE_NAMES = sa.select(t.queues.c.name).order_by(t.queues.c.name)
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


def default_sqlite_url(data_dir: Path) -> str:
    """The store's URL for a data directory: `<data_dir>/state.db`, as an absolute path."""
    return f"sqlite:///{(Path(data_dir).expanduser().absolute() / 'state.db').as_posix()}"


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


class SqlStore:
    """`StateStore` and `AdminStore` on a SQL database. Thread-safe; open it once per process."""

    def __init__(self, engine: sa.Engine, url: str) -> None:
        """Use `SqlStore.open(url)`; this takes an engine already migrated."""
        self._engine = engine
        self.url = url  # without its password
        self._sqlite = engine.dialect.name == "sqlite"
        # SQLite has one writer at a time. Threads of this process queue here instead of in SQLite's busy
        # handler, which sleeps and retries (up to 100 ms a try) and would cut throughput under contention.
        # Other processes still wait through the busy timeout.
        self._write_lock = threading.Lock() if self._sqlite else None

    @classmethod
    def open(cls, url: str) -> SqlStore:
        """Connect to `url` (sqlite:///path/state.db or postgresql+psycopg://user@host:port/db) and
        migrate its schema to the newest version. Raises GpufleetError with a fix if that fails."""
        parsed = parse_url(url)
        engine = make_engine(parsed)
        try:
            migrate(engine)
        except sa.exc.DBAPIError as error:
            engine.dispose()
            raise GpufleetError(
                f"cannot open the database {safe_url(parsed)}: {_first_line(error)}",
                "check that the database server runs and that the URL's host, port, user and database are "
                "right (SQLite: that the file is a gpufleet database and its folder is writable)",
            ) from None
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, safe_url(parsed))

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[sa.Connection]:
        """One transaction; database outages become StoreUnavailableError (nothing was written)."""
        lock = self._write_lock if write and self._write_lock is not None else nullcontext()
        try:
            with lock, self._engine.connect() as connection:
                if not write:
                    connection.execution_options(**{READ_ONLY: True})
                with connection.begin():
                    yield connection
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as error:
            raise StoreUnavailableError(
                f"the database {self.url} did not answer: {_first_line(error)}",
                "check that it runs and is reachable (SQLite: that no other program holds it locked), then retry",
            ) from None
        except sa.exc.DataError as error:
            # A value the database cannot hold (e.g. a NUL character in PostgreSQL text); nothing was written.
            raise GpufleetError(
                f"the database refused a value: {_first_line(error)}", "remove control characters from names and texts"
            ) from None

    @staticmethod
    def _next(connection: sa.Connection, counter: str) -> int:
        """The next number of `counter`; its row stays locked until the transaction ends."""
        return int(connection.execute(_NEXT, {"counter": counter}).scalar_one())

    @staticmethod
    def _bump_cluster_version(connection: sa.Connection) -> None:
        connection.execute(_BUMP_CLUSTER_VERSION)

    def _upsert(self, connection: sa.Connection, table: sa.Table, values: dict[str, Any]) -> None:
        keys = [c.name for c in table.primary_key.columns]
        insert = (sqlite.insert if self._sqlite else postgresql.insert)(table).values(**values)
        changes = {k: v for k, v in values.items() if k not in keys}
        connection.execute(insert.on_conflict_do_update(index_elements=keys, set_=changes))

    # --- StateStore: cluster ------------------------------------------------------------------------------

    def nodes(self) -> tuple[Node, ...]:
        with self._tx(write=False) as c:
            specs = c.execute(sa.select(t.nodes.c.spec).order_by(t.nodes.c.name)).scalars().all()
        return tuple(decode_node(s) for s in specs)

    def queues(self) -> tuple[QueueSpec, ...]:
        with self._tx(write=False) as c:
            specs = c.execute(sa.select(t.queues.c.spec).order_by(t.queues.c.name)).scalars().all()
        return tuple(decode_queue(s) for s in specs)

    def cluster_version(self) -> int:
        with self._tx(write=False) as c:
            return int(c.execute(_CLUSTER_VERSION).scalar_one())

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
                    known = c.execute(_QUEUE_NAMES).scalars().all()
                    raise UnknownNameError(
                        f"queue {job.queue!r} does not exist",
                        f"submit to one of: {_names(known)}" if known else "an admin must create a queue first",
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
                names = None
                for index, job in enumerate(jobs):
                    if any("\x00" in value for value in (job.id, job.queue, job.name)):
                        results.append(SpecError(f"job {job.id!r}", (FieldProblem("id", "contains NUL", "remove it"),)))
                    elif not known[job.queue]:
                        names = names if names is not None else c.execute(_QUEUE_NAMES).scalars().all()
                        results.append(
                            UnknownNameError(
                                f"queue {job.queue!r} does not exist",
                                f"submit to one of: {_names(names)}" if names else "an admin must create a queue first",
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
            raise StaleWriteError(f"a transition names a job the store does not have: {_first_line(error)}") from None

    @staticmethod
    def _lock_versions(c: sa.Connection, ids: list[JobId]) -> dict[JobId, int]:
        """Stored versions of `ids`, their rows locked."""
        ids.sort()
        stored: dict[JobId, int] = {}
        for start in range(0, len(ids), _CHUNK):
            rows = c.execute(_LOCK_VERSIONS, {"ids": ids[start : start + _CHUNK]})
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

    # --- AdminStore: queues and nodes ---------------------------------------------------------------------

    def set_queue(self, spec: QueueSpec) -> None:
        """Create or replace a queue; bumps the cluster version if anything changed."""
        data = encode_queue(spec)
        with self._tx(write=True) as c:
            current = c.execute(
                sa.select(t.queues.c.spec).where(t.queues.c.name == spec.name).with_for_update()
            ).scalar()
            if current == data:
                return
            self._upsert(c, t.queues, {"name": spec.name, "spec": data})
            self._bump_cluster_version(c)

    def delete_queue(self, name: str) -> None:
        """Remove a queue. SpecError if it has active jobs or live tokens; UnknownNameError if absent."""
        with self._tx(write=True) as c:
            found = c.execute(sa.select(t.queues.c.name).where(t.queues.c.name == name).with_for_update()).first()
            if found is None:
                known = c.execute(_QUEUE_NAMES).scalars().all()
                raise UnknownNameError(
                    f"queue {name!r} does not exist",
                    f"name one of: {_names(known)}" if known else "there are no queues",
                )
            active = c.execute(
                sa.select(sa.func.count())
                .select_from(t.jobs)
                .where(t.jobs.c.queue == name, t.jobs.c.state.in_(ACTIVE_STATES))
            ).scalar_one()
            holders = (
                c.execute(
                    sa.select(t.tokens.c.name)
                    .where(t.tokens.c.queue == name, t.tokens.c.revoked.is_(False))
                    .order_by(t.tokens.c.name)
                )
                .scalars()
                .all()
            )
            problems = []
            if active:
                problems.append(
                    FieldProblem(
                        "jobs", f"{active} active", "cancel them or wait until they end, then delete the queue"
                    )
                )
            if holders:
                problems.append(
                    FieldProblem("tokens", f"{len(holders)} issued for it ({_names(holders)})", "revoke them first")
                )
            if problems:
                raise SpecError(f"deletion of queue {name!r}", tuple(problems))
            c.execute(sa.delete(t.queues).where(t.queues.c.name == name))
            self._bump_cluster_version(c)

    def set_nodes(self, nodes: Sequence[Node]) -> None:
        """Replace the inventory, keeping the cordon flag of nodes already known by the same name; bumps the
        cluster version if anything changed."""
        twice = sorted(name for name, count in Counter(n.name for n in nodes).items() if count > 1)
        if twice:
            raise SpecError(
                "node inventory",
                tuple(FieldProblem(f"nodes[{n!r}]", "appears twice", "give every node a unique name") for n in twice),
            )
        with self._tx(write=True) as c:
            stored = {
                row.name: row.spec
                for row in c.execute(sa.select(t.nodes.c.name, t.nodes.c.spec).with_for_update()).all()
            }
            wanted: dict[str, dict[str, Any]] = {}
            for node in nodes:
                kept = node
                if node.name in stored:
                    kept = dataclasses.replace(node, cordoned=bool(stored[node.name].get("cordoned", False)))
                wanted[node.name] = encode_node(kept)
            gone = [name for name in stored if name not in wanted]
            changed = [name for name, spec in wanted.items() if stored.get(name) != spec]
            if not gone and not changed:
                return
            for start in range(0, len(gone), _CHUNK):
                c.execute(sa.delete(t.nodes).where(t.nodes.c.name.in_(gone[start : start + _CHUNK])))
            for name in changed:
                self._upsert(c, t.nodes, {"name": name, "spec": wanted[name]})
            self._bump_cluster_version(c)

    def set_node_flags(self, name: str, *, cordoned: bool | None = None, healthy: bool | None = None) -> Node:
        """Cordon/uncordon a node or mark its health; bumps the cluster version if that changed it."""
        with self._tx(write=True) as c:
            data = c.execute(sa.select(t.nodes.c.spec).where(t.nodes.c.name == name).with_for_update()).scalar()
            if data is None:
                known = c.execute(sa.select(t.nodes.c.name).order_by(t.nodes.c.name)).scalars().all()
                raise UnknownNameError(
                    f"node {name!r} does not exist", f"name one of: {_names(known)}" if known else "there are no nodes"
                )
            node = decode_node(data)
            changed = dataclasses.replace(
                node,
                cordoned=node.cordoned if cordoned is None else cordoned,
                healthy=node.healthy if healthy is None else healthy,
            )
            if changed != node:
                c.execute(sa.update(t.nodes).where(t.nodes.c.name == name).values(spec=encode_node(changed)))
                self._bump_cluster_version(c)
        return changed

    # --- AdminStore: tokens -------------------------------------------------------------------------------

    def create_token(self, token: Token) -> None:
        """Store a token (its secret's hash only). SpecError for a taken id or hash, or a team token without
        a queue; UnknownNameError for a queue that does not exist."""
        problems = []
        if not token.id:
            problems.append(FieldProblem("id", "is empty", "give the token an id"))
        if not token.secret_hash:
            problems.append(FieldProblem("secret_hash", "is empty", "store the SHA-256 of the secret"))
        if Role(token.role) is Role.TEAM and not token.queue:
            problems.append(FieldProblem("queue", "is not set for a team token", "name the team's queue"))
        if problems:
            raise SpecError(f"token {token.name!r}", tuple(problems))
        with self._tx(write=True) as c:
            if token.queue is not None:
                found = c.execute(
                    sa.select(t.queues.c.name).where(t.queues.c.name == token.queue).with_for_update(read=True)
                ).first()
                if found is None:
                    raise UnknownNameError(f"queue {token.queue!r} does not exist", "create the queue first")
            tk = t.tokens
            clash = c.execute(
                sa.select(tk.c.id, tk.c.secret_hash).where(
                    sa.or_(tk.c.id == token.id, tk.c.secret_hash == token.secret_hash)
                )
            ).all()
            if any(row.id == token.id for row in clash):
                raise SpecError(f"token {token.name!r}", (FieldProblem("id", "is taken", "give a new id"),))
            if clash:
                raise SpecError(
                    f"token {token.name!r}", (FieldProblem("secret", "is already in use", "generate a new secret"),)
                )
            c.execute(sa.insert(tk).values(_token_row(token)))

    def token_by_hash(self, secret_hash: str) -> Token | None:
        """The token with this hash, revoked or not (the caller refuses revoked ones)."""
        with self._tx(write=False) as c:
            row = c.execute(sa.select(t.tokens).where(t.tokens.c.secret_hash == secret_hash)).first()
        return None if row is None else _token(row)

    def tokens(self) -> Sequence[Token]:
        with self._tx(write=False) as c:
            rows = c.execute(sa.select(t.tokens).order_by(t.tokens.c.created_at, t.tokens.c.id)).all()
        return [_token(r) for r in rows]

    def revoke_token(self, token_id: str) -> None:
        """Revoke a token for good (idempotent). UnknownNameError if there is no such token."""
        with self._tx(write=True) as c:
            result = c.execute(sa.update(t.tokens).where(t.tokens.c.id == token_id).values(revoked=True))
            if result.rowcount == 0:
                raise UnknownNameError(f"token {token_id!r} does not exist", "list the tokens to see their ids")

    # --- AdminStore: job queries and settings -------------------------------------------------------------

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

    def get_setting(self, key: str) -> str | None:
        with self._tx(write=False) as c:
            value = c.execute(sa.select(t.settings.c.value).where(t.settings.c.key == key)).scalar()
        return None if value is None else str(value)

    def set_setting(self, key: str, value: str) -> None:
        with self._tx(write=True) as c:
            self._upsert(c, t.settings, {"key": key, "value": value})


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
    }


def _transition_row(tr: Transition) -> dict[str, Any]:
    return {"job_id": tr.job_id, "source": tr.source.value, "target": tr.target.value, "reason": tr.reason, "at": tr.at}


def _token_row(token: Token) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "role": Role(token.role).value,
        "queue": token.queue,
        "secret_hash": token.secret_hash,
        "created_at": token.created_at,
        "revoked": token.revoked,
    }


def _token(row: sa.Row[Any]) -> Token:
    return Token(row.id, row.name, Role(row.role), row.queue, row.secret_hash, row.created_at, bool(row.revoked))


def _first_line(error: BaseException) -> str:
    cause = getattr(error, "orig", None) or error
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


if TYPE_CHECKING:

    def _implements_the_ports(store: SqlStore) -> AdminStore:  # mypy checks SqlStore against both Protocols
        return store


__all__ = ["SqlStore", "StoreUnavailableError", "default_sqlite_url"]
