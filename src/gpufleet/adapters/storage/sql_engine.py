"""Engines for the SQL store: URL checks, SQLite and PostgreSQL settings, and migrations to head.

SQLite: WAL (readers never wait for the writer), a busy timeout, foreign keys on, `synchronous=NORMAL`
(in WAL a commit survives a crash of the process; only a power loss can drop the last commits), and
writes that start with `BEGIN IMMEDIATE`. Python's sqlite3 driver otherwise opens a deferred transaction
that takes the write lock only at its first write, so two read-modify-write transactions can both read
and then one fails or, worse, both decide on the same stale read. The driver's own transaction handling
is switched off (`isolation_level=None`) and a `begin` event issues the BEGIN itself: IMMEDIATE for
writes, DEFERRED (a consistent snapshot, no lock) for reads. The store's commits do not checkpoint the log: a
thread of the store does (`wal_checkpoint.py`).

PostgreSQL: psycopg 3, a connection pool checked before use, READ COMMITTED with row locks where a
transaction reads and then writes what it read.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url

from gpufleet.adapters.storage.codec import json_text
from gpufleet.domain.errors import GpufleetError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
BUSY_TIMEOUT_S = 30.0
# Any constant: the key of the advisory lock two processes take to migrate one PostgreSQL database once.
_MIGRATION_LOCK = 0x67707566
# Execution option a read-only transaction sets on its connection, read by the SQLite `begin` event.
READ_ONLY = "gpufleet_read_only"

URL_FIX = "give sqlite:///path/to/state.db or postgresql+psycopg://user@host:port/database"


class StoreUnavailableError(GpufleetError):
    """The database cannot be reached or stayed locked: nothing was written, the call may be retried."""


class StoreFullError(StoreUnavailableError):
    """The database's disk is full: nothing was written; the call succeeds again once space is freed."""

    def __init__(self, where: str, detail: str) -> None:
        self.where = where
        super().__init__(
            f"disk full at {where}: the store cannot write ({detail})",
            "free space on that file system, then retry (keep job logs elsewhere and smaller with `gpufleet up "
            "--log-dir`, `--log-cap` and `--log-max-total`)",
        )


def is_disk_full(error: BaseException) -> bool:
    """Whether a database error says its disk is full (SQLite's SQLITE_FULL, PostgreSQL's 53100)."""
    cause = getattr(error, "orig", None) or error
    if getattr(cause, "sqlstate", None) == "53100":
        return True
    text = str(cause).lower()
    return "database or disk is full" in text or "no space left on device" in text


def parse_url(url: str) -> URL:
    """The URL as SQLAlchemy reads it, checked: SQLite with a file, or PostgreSQL through psycopg."""
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a port that is not a number raises here, not at the first connection
    except (sa.exc.ArgumentError, ValueError):
        raise GpufleetError(f"database URL {url!r} cannot be read", URL_FIX) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.drivername not in ("sqlite", "sqlite+pysqlite"):  # the BEGIN handling below is pysqlite's
            raise GpufleetError(f"database driver {parsed.drivername!r} is not supported", URL_FIX)
        if parsed.database in (None, "", ":memory:") or (parsed.query.get("mode") == "memory"):
            raise GpufleetError(
                f"database URL {safe_url(parsed)!r} is an in-memory SQLite database, which each connection sees empty",
                "give a file, e.g. sqlite:///path/to/state.db",
            )
        return parsed
    if backend == "postgresql":
        if parsed.drivername == "postgresql":  # SQLAlchemy's default driver, psycopg2, is not installed
            return parsed.set(drivername="postgresql+psycopg")
        if parsed.drivername != "postgresql+psycopg":
            raise GpufleetError(f"database driver {parsed.drivername!r} is not supported", URL_FIX)
        return parsed
    raise GpufleetError(f"database {backend!r} is not supported", URL_FIX)


def safe_url(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def make_engine(url: URL, *, autocheckpoint: bool = True) -> Engine:
    """An engine for the URL. SQLite with `autocheckpoint=False`: commits never checkpoint the write-ahead log,
    whoever opens the engine does (`WalCheckpointer`)."""
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, autocheckpoint)
    return sa.create_engine(
        url,
        pool_size=8,
        max_overflow=24,
        pool_timeout=BUSY_TIMEOUT_S,
        pool_pre_ping=True,  # a restarted server must not surface as an error on the next call
        pool_recycle=1800,
        json_serializer=json_text,
        connect_args={"connect_timeout": 10},
    )


def _sqlite_engine(url: URL, autocheckpoint: bool) -> Engine:
    assert url.database is not None
    folder = Path(url.database).expanduser().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GpufleetError(
            f"cannot create the folder {folder} for the database: {error.strerror}",
            "give a database path in a folder you can write to",
        ) from None
    engine = sa.create_engine(
        url,
        # Threads of the API and the loop share the pool; connections move between threads.
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
        pool_size=8,
        max_overflow=24,
        pool_timeout=BUSY_TIMEOUT_S,
        json_serializer=json_text,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves, below
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        _enable_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        if not autocheckpoint:
            cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        deferred = connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN DEFERRED" if deferred else "BEGIN IMMEDIATE")

    return engine


def _enable_wal(cursor: Any) -> None:
    """`PRAGMA journal_mode=WAL`, retried while another connection holds the file: switching a new database
    to WAL needs it alone, and SQLite reports "database is locked" at once there instead of waiting out the
    busy timeout (seen when several processes open a new database together)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def alembic_config(url: str | None = None) -> Config:
    """Alembic's configuration for our migrations, built in code (no alembic.ini). With a `url`, alembic's
    commands open that database themselves; this is how to write a new migration:

        from alembic import command
        command.revision(alembic_config("sqlite:///dev.db"), message="what changed", autogenerate=True)
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        config.set_main_option("sqlalchemy.url", parse_url(url).render_as_string(hide_password=False))
    return config


def migrate(engine: Engine) -> None:
    """Bring the database to the newest schema (`alembic upgrade head`); a no-op when it is there."""
    config = alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        config.attributes["connection"] = connection
        try:
            command.upgrade(config, "head")
        except CommandError as error:
            # Typically: the database was migrated by a newer gpufleet, whose revision this one lacks.
            raise GpufleetError(
                f"the database schema cannot be brought up to date: {error}",
                "run the gpufleet version that last wrote this database, or a newer one",
            ) from None


def head_revision() -> str:
    """The newest migration this code ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head
