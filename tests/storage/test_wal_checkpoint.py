"""The SQLite store checkpoints its write-ahead log from a thread of its own, not inside the writers' commits."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.adapters.storage.wal_checkpoint import WalCheckpointer
from gpufleet.domain import QueueSpec
from tests.storage.test_contract import job

THREAD = "gpufleet-wal-checkpoint"


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD]


def _jobs_in_the_database_file(tmp_path: Path) -> int:
    """Jobs a reader sees in a copy of the database file alone, without its log: what checkpoints copied there."""
    copy = tmp_path / "copy.db"
    copy.write_bytes((tmp_path / "state.db").read_bytes())
    with contextlib.closing(sqlite3.connect(copy)) as connection:
        return int(connection.execute("SELECT count(*) FROM jobs").fetchone()[0])


def _wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_the_store_turns_off_the_commits_checkpoints_and_runs_its_own_thread(tmp_path: Path) -> None:
    threads_before = len(_checkpoint_threads())
    store = SqlStore.open(default_sqlite_url(tmp_path))
    try:
        assert len(_checkpoint_threads()) == threads_before + 1
        with store._engine.connect() as connection:
            raw = connection.connection.driver_connection
            assert isinstance(raw, sqlite3.Connection)
            assert raw.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
            assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        store.set_queue(QueueSpec("default"))
        store.submit_many([job(f"j{i}") for i in range(50)], at=1.0)
    finally:
        store.close()
    assert len(_checkpoint_threads()) == threads_before
    # The last connection to close checkpointed what was left and removed the log.
    assert not (tmp_path / "state.db-wal").exists()
    assert _jobs_in_the_database_file(tmp_path) == 50


@pytest.mark.parametrize(("pages", "copied"), [(1, True), (1_000_000, False)])
def test_the_thread_checkpoints_a_log_from_its_threshold_on(tmp_path: Path, pages: int, copied: bool) -> None:
    store = SqlStore.open(default_sqlite_url(tmp_path))
    try:
        assert store._checkpointer is not None
        store._checkpointer.stop()  # this test's own checkpointer instead, with a threshold of `pages`
        store.set_queue(QueueSpec("default"))
        # Until the loop writes, the jobs table's pages are what the migrations' commits left: checkpointed here,
        # so that only the jobs below are in the log.
        with contextlib.closing(sqlite3.connect(tmp_path / "state.db")) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        checkpointer = WalCheckpointer(tmp_path / "state.db", interval_s=0.01, pages=pages).start()
        try:
            store.submit_many([job(f"j{i}") for i in range(200)], at=1.0)
            if copied:
                assert _wait_for(lambda: _jobs_in_the_database_file(tmp_path) == 200)
                assert checkpointer.checkpoints >= 1
            else:
                time.sleep(0.3)  # thirty looks at a log below the threshold
                assert checkpointer.checkpoints == 0
                assert _jobs_in_the_database_file(tmp_path) == 0
        finally:
            checkpointer.stop()
    finally:
        store.close()


def test_a_checkpointer_that_cannot_open_its_database_stops_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpointer = WalCheckpointer(tmp_path / "missing" / "state.db", interval_s=0.01).start()
    checkpointer._thread.join(timeout=5.0)
    assert not checkpointer._thread.is_alive()
    assert checkpointer.checkpoints == 0
    assert "WAL checkpoints off" in caplog.text
    checkpointer.stop()  # stopping a thread that already ended is a no-op
