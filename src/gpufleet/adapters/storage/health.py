"""Is a store fit to trust? Checks before a store is opened, a sanity check of its schema after, moving a
damaged SQLite store aside, and online backups.

A control plane that opened an empty or damaged store as if it were new would think no job runs and stop
every worker it finds: so a store that existed must pass these checks, or the control plane does not start.

- SQLite, before opening: a file that exists must not be empty, must start with SQLite's header, and must
  pass `PRAGMA quick_check` (a damaged page shows there, not at open: SQLite reads pages lazily); a
  database without gpufleet's tables is refused unless it holds no tables at all.
- Both, after migrating (`verify_schema`): every table of the schema is there, and the counters in `meta`.
- PostgreSQL has no file to inspect: a database with gpufleet's tables but no Alembic revision is refused;
  an empty database is a new store (the data directory's store id tells a new store from a lost one, see
  `server/store_guard.py`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from gpufleet.adapters.storage import schema as t
from gpufleet.domain.errors import GpufleetError

SQLITE_HEADER = b"SQLite format 3\x00"
SIDE_FILES = ("-wal", "-shm")  # SQLite's write-ahead log and its index, next to the database file
_MAX_PROBLEMS = 5  # lines of `quick_check` quoted in an error
_CREATING_S = 1.0  # how long an empty file may wait for its header (another process creating it)


class StoreDamagedError(GpufleetError):
    """A store that exists but cannot be trusted: empty, unreadable, corrupt, or without gpufleet's schema.
    `problem` says what is wrong in a few words."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"the store {where} {problem}", fix)


class BackupUnsupportedError(GpufleetError):
    """A store gpufleet does not copy itself (PostgreSQL): the fix says which tool does."""


@dataclass(frozen=True)
class Inspection:
    """What a store was before this process opened it."""

    existed: bool  # it held gpufleet's schema already (False: it is created now)


def sqlite_path(url: URL) -> Path | None:
    """The database file of a SQLite URL (None for other databases)."""
    if url.get_backend_name() != "sqlite" or url.database is None:
        return None
    return Path(url.database).expanduser()


def inspect_sqlite(path: Path) -> Inspection:
    """Check an SQLite store before it is opened; StoreDamagedError if it exists and cannot be trusted."""
    fix = restore_fix()
    if not path.exists():
        orphans = [path.name + side for side in SIDE_FILES if path.with_name(path.name + side).exists()]
        if orphans:
            raise StoreDamagedError(str(path), f"is missing, but its {orphans[0]} file is there", fix)
        return Inspection(existed=False)
    header = _header(path, fix)
    deadline = time.monotonic() + _CREATING_S
    while not header and time.monotonic() < deadline:
        # SQLite creates the file empty and writes its header moments later: another process may be
        # creating it right now. A file that stays empty was emptied.
        time.sleep(0.02)
        header = _header(path, fix)
    if not header:
        raise StoreDamagedError(str(path), "is empty (0 bytes)", fix)
    if header != SQLITE_HEADER:
        raise StoreDamagedError(str(path), "is not a SQLite database (its first bytes are not SQLite's header)", fix)
    try:
        connection = sqlite3.connect(path, timeout=30.0)
    except sqlite3.Error as error:
        raise StoreDamagedError(str(path), f"cannot be opened ({error})", fix) from None
    try:
        problems = [row[0] for row in connection.execute(f"PRAGMA quick_check({_MAX_PROBLEMS})")]
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as error:
        raise StoreDamagedError(str(path), f"is corrupt ({error})", fix) from None
    finally:
        connection.close()
    if problems != ["ok"]:
        raise StoreDamagedError(str(path), f"fails SQLite's integrity check ({'; '.join(problems)})", fix)
    if not tables:
        return Inspection(existed=False)  # created, but not yet given its schema (another process may be at it)
    if "alembic_version" not in tables:
        raise StoreDamagedError(
            str(path),
            f"is not a gpufleet store (it holds tables {', '.join(sorted(tables)[:5])}, not gpufleet's)",
            "give gpufleet its own database file (--db), or --reset-store to move this one aside",
        )
    return Inspection(existed=True)


def _header(path: Path, fix: str) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(len(SQLITE_HEADER))
    except OSError as error:
        raise StoreDamagedError(str(path), f"cannot be read ({error.strerror})", fix) from None


def inspect_postgres(engine: sa.Engine, where: str) -> Inspection:
    """Check a PostgreSQL store before it is migrated; an empty database is a new store."""
    tables = set(sa.inspect(engine).get_table_names())
    ours = tables & set(t.metadata.tables)
    if "alembic_version" in tables:
        return Inspection(existed=True)
    if ours:
        raise StoreDamagedError(
            where,
            f"holds gpufleet tables ({', '.join(sorted(ours))}) but no schema revision (alembic_version)",
            postgres_fix(),
        )
    return Inspection(existed=False)


def verify_schema(engine: sa.Engine, where: str, is_sqlite: bool) -> None:
    """After migrating: every table of the schema, and each counter, is there."""
    tables = set(sa.inspect(engine).get_table_names())
    missing = sorted(set(t.metadata.tables) - tables)
    fix = restore_fix() if is_sqlite else postgres_fix()
    if missing:
        raise StoreDamagedError(where, f"lacks tables its schema revision has: {', '.join(missing)}", fix)
    with engine.connect() as connection:
        counters = set(connection.execute(sa.select(t.meta.c.key)).scalars())
    gone = sorted(set(t.COUNTERS) - counters)
    if gone:
        raise StoreDamagedError(where, f"lacks its counters {', '.join(gone)}", fix)


def restore_fix() -> str:
    return (
        "restore the store from a backup (stop gpufleet, copy the backup over the store file, start again; "
        "see `gpufleet backup`), or start over on purpose with `gpufleet up --reset-store`, which moves the old "
        "file aside (never deletes it) and stops the jobs still running from it"
    )


def postgres_fix() -> str:
    return (
        "restore the database from a backup (pg_restore of a pg_dump); gpufleet never drops PostgreSQL data, so to "
        "start over drop and create the database yourself (after pg_dump if you want to keep it), then start "
        "with --reset-store"
    )


def move_aside(path: Path, now: float | None = None) -> list[Path]:
    """Rename an SQLite store and its side files to `<name>.reset-<UTC time>[-wal|-shm]`; nothing is
    deleted. Returns the new paths (empty when there was no file)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    moved: list[Path] = []
    for suffix in ("", *SIDE_FILES):
        source = path.with_name(path.name + suffix)
        if not source.exists():
            continue
        target = path.with_name(f"{path.name}.reset-{stamp}{suffix}")
        source.rename(target)
        moved.append(target)
    return moved


@dataclass(frozen=True)
class BackupInfo:
    path: Path
    size: int
    jobs: int


def backup_sqlite(source: sqlite3.Connection, destination: Path) -> BackupInfo:
    """Copy a live SQLite database with SQLite's online backup API (a consistent snapshot; writers carry on),
    check the copy, and move it into place readable by its owner only (it holds job environments and token
    hashes). The destination appears whole or not at all."""

    def copy(partial: Path) -> None:
        target = sqlite3.connect(partial)
        try:
            source.backup(target)
            # One self-contained file: the copy would otherwise keep the store's WAL mode, and files beside it.
            target.execute("PRAGMA journal_mode=DELETE")
        finally:
            target.close()

    return write_backup(destination, copy)


def write_backup(destination: Path, fill: Callable[[Path], None]) -> BackupInfo:
    """Create `destination` (mode 0600) through a partial file that `fill` writes a SQLite database into,
    checked (`PRAGMA quick_check`, the jobs table readable) before it is renamed into place."""
    destination = destination.expanduser()
    if destination.is_dir():
        raise GpufleetError(f"{destination} is a folder", "give the path of the backup file to write")
    folder = destination.parent
    if not folder.is_dir():
        raise GpufleetError(f"the folder {folder} does not exist", "create it first, or give another path")
    partial = folder / f".{destination.name}.partial-{os.getpid()}"
    try:
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(descriptor)
        fill(partial)
        jobs = _checked_jobs(partial)
        os.replace(partial, destination)
    except OSError as error:
        raise GpufleetError(
            f"cannot write the backup to {destination}: {error.strerror}", "give a writable path with free space"
        ) from None
    except sqlite3.Error as error:
        raise GpufleetError(f"the backup failed: {error}", "check the store and the destination, then retry") from None
    finally:
        for leftover in (partial, *(partial.with_name(partial.name + side) for side in SIDE_FILES)):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    return BackupInfo(destination, destination.stat().st_size, jobs)


def _checked_jobs(path: Path) -> int:
    """How many jobs a backup holds, once SQLite found it whole."""
    connection = sqlite3.connect(path)
    try:
        problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise GpufleetError(f"the backup failed its integrity check ({problems[0]})", "check the store, then retry")
        return int(connection.execute("SELECT count(*) FROM jobs").fetchone()[0])
    finally:
        connection.close()


def backup_sqlite_file(store: Path, destination: Path) -> BackupInfo:
    """Back up the SQLite store at `store` directly (whether or not a control plane has it open)."""
    if not store.exists():
        raise GpufleetError(f"there is no store at {store}", "give the data directory (--data-dir) of the store")
    inspect_sqlite(store)
    source = sqlite3.connect(store, timeout=30.0)
    try:
        return backup_sqlite(source, destination)
    finally:
        source.close()


def pg_dump_hint(url: str) -> str:
    return (
        f"back up PostgreSQL with its own tools: pg_dump --format=custom --file=BACKUP '{url}' "
        "(restore with pg_restore --clean --dbname=… BACKUP while gpufleet is stopped)"
    )
