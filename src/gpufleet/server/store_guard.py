"""Opening the control plane's store so that a lost or damaged store never stops running jobs.

At start the executor stops every worker the store does not list as running: right when the store is
the truth, disastrous when it lost its rows (a truncated file, a database recreated empty, the wrong
`--db`). So before anything reads it:

- the store itself must pass its checks (`adapters/storage/health.py`: not empty, not corrupt, its schema
  and counters present);
- the data directory remembers which store it ran with (`store-id`, the id also kept in the store's
  settings). A store that is new, or another one, while the data directory says otherwise is refused: its
  jobs may still run and their records are elsewhere.

`--reset-store` starts over on purpose: an SQLite store is moved aside (never deleted), the store that is
then opened becomes this data directory's, and the executor stops the jobs still running from the old
one. gpufleet never drops PostgreSQL data: a damaged PostgreSQL store is dropped by its owner.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.adapters.storage.health import StoreDamagedError, move_aside, sqlite_path
from gpufleet.adapters.storage.sql import SqlStore
from gpufleet.adapters.storage.sql_engine import parse_url, safe_url
from gpufleet.domain.errors import GpufleetError
from gpufleet.ports.admin import AuditEntry

log = logging.getLogger("gpufleet.up")

MARKER = "store-id"  # in the data directory
STORE_ID_SETTING = "store_id"  # in the store's settings


@dataclass(frozen=True)
class OpenedStore:
    store: SqlStore
    reset: bool = False
    moved: tuple[Path, ...] = ()  # where a reset put the old store's files


class StoreRefusedError(GpufleetError):
    """The store cannot be trusted, or is not this data directory's: the control plane does not start."""


def open_store(data_dir: Path, url: str, *, reset: bool = False, actor: str = "local") -> OpenedStore:
    """Open the store at `url` for the data directory, refusing (StoreRefusedError) what cannot be trusted.
    With `reset`, start over: move a SQLite store aside first, and take whatever store is then opened."""
    parsed = parse_url(url)
    where = safe_url(parsed)
    path = sqlite_path(parsed)
    moved: list[Path] = []
    if reset and path is not None:
        moved = move_aside(path)
        for file in moved:
            log.warning("--reset-store: moved %s aside (kept, not deleted)", file)
    elif path is not None and not path.exists() and read_marker(data_dir) is not None:
        # Refused before SQLite creates a file, so that the next start says the same.
        raise _not_ours(data_dir, where, "is missing", str(read_marker(data_dir)))
    try:
        store = SqlStore.open(url)
    except StoreDamagedError as error:
        raise StoreRefusedError(
            f"{error.message}; gpufleet did not start, so that no job still running is stopped on the word of a "
            "store that lost it",
            error.fix,
        ) from None
    try:
        _check_records(store, where)
        _check_identity(data_dir, store, where, reset=reset)
    except BaseException:
        store.close()
        raise
    if reset:
        detail = json.dumps({"moved": [str(p) for p in moved]} if moved else {"store": where})
        store.audit(AuditEntry(time.time(), actor, "store.reset", where, detail))
    return OpenedStore(store, reset, tuple(moved))


def _check_records(store: SqlStore, where: str) -> None:
    """Every record the loop reads at start must decode: SQLite's integrity check sees pages, not the JSON in
    them, and the executor must not be told the wrong set of running jobs."""
    try:
        store.nodes()
        store.queues()
        store.active()
    except GpufleetError:
        raise
    except Exception as error:  # a record that does not decode (KeyError, ValueError, TypeError, …)
        raise StoreRefusedError(
            f"the store {where} holds a record that cannot be read ({type(error).__name__}: {error}); gpufleet did "
            "not start, so that no job still running is stopped on the word of a damaged store",
            "restore it from a backup (see `gpufleet backup`), or start over on purpose with `gpufleet up "
            "--reset-store`",
        ) from None


def _check_identity(data_dir: Path, store: SqlStore, where: str, *, reset: bool) -> None:
    remembered = read_marker(data_dir)
    store_id = store.get_setting(STORE_ID_SETTING)
    if remembered is not None and store_id != remembered and not reset:
        if not store.existed:
            what = "is new (it held no gpufleet data)"
        else:
            what = f"is another store ({f'id {store_id}' if store_id else 'it has no store id'})"
        raise _not_ours(data_dir, where, what, remembered)
    if store_id is None:
        store_id = "s-" + secrets.token_hex(8)
        store.set_setting(STORE_ID_SETTING, store_id)
    if remembered != store_id:
        write_marker(data_dir, store_id)


def _not_ours(data_dir: Path, where: str, what: str, remembered: str) -> StoreRefusedError:
    return StoreRefusedError(
        f"the store {where} {what}, but this data directory ({data_dir}) ran jobs with store {remembered}; "
        "gpufleet did not start, so that jobs still running from that store are not stopped",
        "point --db at that store, or restore it from a backup (see `gpufleet backup`); to start over on "
        f"purpose, `gpufleet up --reset-store`{_reset_hint(where)}",
    )


def _reset_hint(where: str) -> str:
    if where.startswith("sqlite"):
        return " (it moves the SQLite file aside and stops the jobs still running)"
    return " (it stops the jobs still running)"


def read_marker(data_dir: Path) -> str | None:
    try:
        text = (data_dir / MARKER).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise GpufleetError(f"cannot read {data_dir / MARKER}: {error.strerror}", "check the data directory") from None
    return text or None


def write_marker(data_dir: Path, store_id: str) -> None:
    """Atomically: a crash leaves the old id or the new one, never half of one."""
    marker = data_dir / MARKER
    partial = data_dir / f".{MARKER}.partial"
    partial.write_text(store_id + "\n", encoding="utf-8")
    os.replace(partial, marker)


__all__ = ["MARKER", "OpenedStore", "StoreRefusedError", "open_store"]
