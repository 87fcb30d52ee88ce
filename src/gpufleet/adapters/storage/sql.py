"""The durable store of the control plane, on SQLite or PostgreSQL: `StateStore` for the loop and
`AdminStore` for the API.

Every method is one short transaction (engine settings in `sql_engine.py`, tables in `schema.py`, JSON in
`codec.py`). Semantics follow `InMemoryStore`, plus the checks a shared store needs: a submit to an
unknown queue is refused, a request for an unknown job too. The methods live in parts, one per group of
tables (`sql_jobs.py`, `sql_cluster.py`, `sql_access.py`, `sql_progress.py`, `sql_cost.py`, on the shared
`sql_base.py`); this module puts them together and opens the database.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from gpufleet.adapters.storage.health import (
    BackupInfo,
    BackupUnsupportedError,
    StoreDamagedError,
    backup_sqlite,
    inspect_postgres,
    inspect_sqlite,
    pg_dump_hint,
    sqlite_path,
    verify_schema,
)
from gpufleet.adapters.storage.sql_access import AccessTables
from gpufleet.adapters.storage.sql_base import first_line
from gpufleet.adapters.storage.sql_cluster import ClusterTables
from gpufleet.adapters.storage.sql_cost import CostTables
from gpufleet.adapters.storage.sql_engine import (
    StoreFullError,
    StoreUnavailableError,
    make_engine,
    migrate,
    parse_url,
    safe_url,
)
from gpufleet.adapters.storage.sql_jobs import JobTables
from gpufleet.adapters.storage.sql_progress import ProgressTables
from gpufleet.adapters.storage.wal_checkpoint import WalCheckpointer
from gpufleet.domain.errors import GpufleetError

if TYPE_CHECKING:
    from gpufleet.ports.admin import AdminStore


def default_sqlite_url(data_dir: Path) -> str:
    """The store's URL for a data directory: `<data_dir>/state.db`, as an absolute path."""
    return f"sqlite:///{(Path(data_dir).expanduser().absolute() / 'state.db').as_posix()}"


class SqlStore(JobTables, ClusterTables, AccessTables, ProgressTables, CostTables):
    """`StateStore` and `AdminStore` on a SQL database. Thread-safe; open it once per process.

    `open` refuses a store that existed but cannot be trusted (StoreDamagedError, see `health.py`);
    `existed` says whether it held gpufleet's schema before this open (False: created now)."""

    existed: bool = False
    _checkpointer: WalCheckpointer | None = None

    @classmethod
    def open(cls, url: str) -> SqlStore:
        """Connect to `url` (sqlite:///path/state.db or postgresql+psycopg://user@host:port/db) and
        migrate its schema to the newest version. Raises GpufleetError with a fix if that fails."""
        parsed = parse_url(url)
        where = safe_url(parsed)
        path = sqlite_path(parsed)
        inspection = inspect_sqlite(path) if path is not None else None
        # SQLite: the log is checkpointed by a thread of the store's own, not inside the writers' commits.
        engine = make_engine(parsed, autocheckpoint=path is None)
        try:
            if inspection is None:
                inspection = inspect_postgres(engine, where)
            migrate(engine)
            verify_schema(engine, where, is_sqlite=path is not None)
        except sa.exc.DBAPIError as error:
            engine.dispose()
            raise GpufleetError(
                f"cannot open the database {safe_url(parsed)}: {first_line(error)}",
                "check that the database server runs and that the URL's host, port, user and database are "
                "right (SQLite: that the file is a gpufleet database and its folder is writable)",
            ) from None
        except BaseException:
            engine.dispose()
            raise
        store = cls(engine, where)
        store.existed = inspection.existed
        if path is not None:
            store._checkpointer = WalCheckpointer(path).start()
        return store

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        self._engine.dispose()

    def backup(self, destination: Path) -> BackupInfo:
        """An online backup of the store into `destination` (SQLite; a consistent snapshot taken while the
        control plane keeps writing). PostgreSQL: a GpufleetError that says how to use pg_dump instead."""
        if not self._sqlite:
            raise BackupUnsupportedError(
                f"the store is PostgreSQL ({self.url}), which gpufleet does not copy itself", pg_dump_hint(self.url)
            )
        with self._engine.connect() as connection:
            raw = connection.connection.driver_connection
            assert isinstance(raw, sqlite3.Connection)
            return backup_sqlite(raw, destination)

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


if TYPE_CHECKING:

    def _implements_the_ports(store: SqlStore) -> AdminStore:  # mypy checks SqlStore against both Protocols
        return store


__all__ = ["SqlStore", "StoreDamagedError", "StoreFullError", "StoreUnavailableError", "default_sqlite_url"]
