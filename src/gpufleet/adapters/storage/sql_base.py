"""What every part of the SQL store shares: the engine, one transaction at a time, counters and upserts.

`SqlStore` (sql.py) is built from parts that each own a group of tables: `sql_jobs.py` (jobs, their
transitions, requests, notices and idempotency keys), `sql_cluster.py` (queues and nodes) and
`sql_access.py` (tokens, settings and the audit log). They all inherit this base, so a method of one part
runs in one short transaction exactly as the others do.
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.compiler import SQLCompiler

from gpufleet.adapters.storage import schema as t
from gpufleet.adapters.storage.sql_engine import READ_ONLY, StoreFullError, StoreUnavailableError, is_disk_full
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.lifecycle import TERMINAL, JobState, Transition
from gpufleet.domain.records import JobRecord

ACTIVE_STATES = tuple(s.value for s in JobState if s not in TERMINAL)
CHUNK = 500  # ids per IN (...) list, well under SQLite's limit on bound parameters
_LISTED = 20  # names listed in an error message at most

_BUMP_CLUSTER_VERSION = sa.update(t.meta).where(t.meta.c.key == t.CLUSTER_VERSION).values(value=t.meta.c.value + 1)
_NEXT = (
    sa.update(t.meta)
    .where(t.meta.c.key == sa.bindparam("counter"))
    .values(value=t.meta.c.value + 1)
    .returning(t.meta.c.value)
)
QUEUE_NAMES = sa.select(t.queues.c.name).order_by(t.queues.c.name)


def in_listed(column: sa.ColumnElement[str], name: str, *, sqlite_dialect: bool) -> sa.ColumnElement[bool]:
    """`column` is one of the strings of the list bound to `name` (bind `listed(...)`): one parameter however long
    the list, so the statement is compiled once. An expanding `IN` is rendered again on every call, in time that
    grows faster than its length (a tenth of a loop step's write at 1,000 ids)."""
    if sqlite_dialect:
        each = sa.func.json_each(sa.bindparam(name, type_=sa.String)).table_valued("value")
        return column.in_(sa.select(each.c.value))
    return column == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(sa.String)))


class DriverRows:
    """A statement compiled once for a dialect and run over many rows straight through the driver's
    `executemany` (`Connection.exec_driver_sql`): SQLAlchemy's per-row parameter processing (a dict built and
    checked per row: most of the time of a thousand-row write) is skipped. Only for rows whose values the
    driver takes as they are (str, int, float, None): no type of the statement may need a bind processor."""

    def __init__(self, statement: sa.ClauseElement, dialect: sa.Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)  # a statement's compilation, not a DDL one
        self.sql = str(compiled)
        # Positional drivers (SQLite's `?`) take tuples in the compiled order; named ones (psycopg) the dicts.
        self.order: tuple[str, ...] | None = tuple(compiled.positiontup or ()) if compiled.positional else None
        # A row's values in that order, read in C (a generator per row took four times as long).
        self._values: Callable[[dict[str, Any]], tuple[Any, ...]] | None = None
        if self.order:
            getter = operator.itemgetter(*self.order)
            self._values = getter if len(self.order) > 1 else lambda row: (getter(row),)

    def run(self, connection: sa.Connection, rows: Sequence[dict[str, Any]]) -> sa.CursorResult[Any]:
        values = self._values
        if self.order is None:
            return connection.exec_driver_sql(self.sql, list(rows))
        if values is None:  # a statement without parameters
            return connection.exec_driver_sql(self.sql, [() for _ in rows])
        return connection.exec_driver_sql(self.sql, [values(row) for row in rows])


def names(listed: Sequence[str]) -> str:
    """Names for an error message, the first few and how many more."""
    shown = ", ".join(listed[:_LISTED])
    return shown + (f" and {len(listed) - _LISTED} more" if len(listed) > _LISTED else "")


def first_line(error: BaseException) -> str:
    cause = getattr(error, "orig", None) or error
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


class SqlBase:
    """The engine and its transactions. Thread-safe; open the store once per process."""

    def __init__(self, engine: sa.Engine, url: str) -> None:
        """Use `SqlStore.open(url)`; this takes an engine already migrated."""
        self._engine = engine
        self.url = url  # without its password
        self._sqlite = engine.dialect.name == "sqlite"
        # Where its disk is, in words for a "disk full at …" message.
        self._where = str(Path(engine.url.database or "").parent) if self._sqlite else url
        # SQLite has one writer at a time. Threads of this process queue here instead of in SQLite's busy
        # handler, which sleeps and retries (up to 100 ms a try) and would cut throughput under contention.
        # Other processes still wait through the busy timeout.
        self._write_lock = threading.Lock() if self._sqlite else None
        self._upserts: dict[str, sa.Insert] = {}  # `_upsert_many`'s statements, by table

    def _listed(self, values: Sequence[str]) -> str | list[str]:
        """`values` bound as one parameter of an `in_listed` condition: a JSON array for SQLite, an array else."""
        return json.dumps(list(values)) if self._sqlite else list(values)

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
            if is_disk_full(error):
                raise StoreFullError(self._where, first_line(error)) from None
            raise StoreUnavailableError(
                f"the database {self.url} did not answer: {first_line(error)}",
                "check that it runs and is reachable (SQLite: that no other program holds it locked), then retry",
            ) from None
        except sa.exc.DataError as error:
            # A value the database cannot hold (e.g. a NUL character in PostgreSQL text); nothing was written.
            raise GpufleetError(
                f"the database refused a value: {first_line(error)}", "remove control characters from names and texts"
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

    def _upsert_many(self, connection: sa.Connection, table: sa.Table, rows: Sequence[dict[str, Any]]) -> None:
        """Insert `rows` (all with the same columns), a row whose key is stored replacing it: one statement,
        built once per table and executed for all rows (`_upsert` builds one per row)."""
        if not rows:
            return
        statement = self._upserts.get(table.name)
        if statement is None:
            keys = [c.name for c in table.primary_key.columns]
            insert = (sqlite.insert if self._sqlite else postgresql.insert)(table)
            changes = {c.name: insert.excluded[c.name] for c in table.columns if c.name not in keys}
            statement = insert.on_conflict_do_update(index_elements=keys, set_=changes)
            self._upserts[table.name] = statement
        connection.execute(statement, list(rows))

    # Hooks of the cost tables (`sql_cost.CostTables` fills them in), called inside other parts' transactions.

    def _charge_started(
        self, c: sa.Connection, records: Mapping[str, JobRecord], transitions: Sequence[Transition]
    ) -> None:
        """Price the attempts that begin holding resources in this write."""

    def _record_losses(
        self, c: sa.Connection, records: Mapping[str, JobRecord], transitions: Sequence[Transition]
    ) -> None:
        """Keep the work lost by the attempts that end in this write."""

    def _deprioritised_queues(self, c: sa.Connection) -> frozenset[str]:
        """Queues whose budget is spent and whose action is to deprioritise them."""
        return frozenset()
