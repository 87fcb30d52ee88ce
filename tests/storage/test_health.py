"""A store that existed but cannot be trusted is refused before anything reads it as the truth: empty,
not a database, corrupt pages, another program's database, tables or counters missing. And the tools
around it: moving a damaged store aside, online backups."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpufleet.adapters.storage.health import StoreDamagedError, backup_sqlite_file, move_aside
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.domain import GpufleetError, QueueSpec
from tests.storage.conftest import sql_url
from tests.storage.test_contract import job


@pytest.fixture
def used(tmp_path: Path) -> Path:
    """A store that ran: a queue and 300 jobs (a few hundred KiB, many pages), closed cleanly."""
    with SqlStore.open(default_sqlite_url(tmp_path)) as store:
        store.set_queue(QueueSpec("default"))
        store.submit_many([job(f"j{i}", name="x" * 200) for i in range(300)], 1.0)
    return tmp_path / "state.db"


def refusal(path: Path) -> StoreDamagedError:
    with pytest.raises(StoreDamagedError) as caught:
        SqlStore.open(f"sqlite:///{path}")
    assert "restore the store from a backup" in caught.value.fix
    assert "--reset-store" in caught.value.fix
    return caught.value


def test_an_emptied_store_is_refused_not_started_fresh(used: Path) -> None:
    os.truncate(used, 0)
    assert refusal(used).problem == "is empty (0 bytes)"
    assert used.stat().st_size == 0  # nothing was written to it


def test_garbage_in_the_middle_is_found_by_the_integrity_check(used: Path) -> None:
    data = bytearray(used.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 3000] = os.urandom(3000)
    used.write_bytes(bytes(data))
    problem = refusal(used).problem
    assert "corrupt" in problem or "integrity check" in problem


def test_a_file_that_is_not_sqlite_or_not_gpufleets_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"PK\x03\x04 a zip file, say" * 50)
    assert "not a SQLite database" in refusal(path).problem
    path.unlink()
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE invoices (id INTEGER)")
    other.commit()
    other.close()
    with pytest.raises(StoreDamagedError, match=r"not a gpufleet store .*invoices"):
        SqlStore.open(f"sqlite:///{path}")


def test_a_missing_store_beside_its_write_ahead_log_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state.db-wal").write_bytes(b"\x37\x7f\x06\x82" + bytes(28))
    assert "is missing, but its state.db-wal" in refusal(tmp_path / "state.db").problem


def test_a_store_created_now_or_reopened_says_so(tmp_path: Path) -> None:
    url = default_sqlite_url(tmp_path)
    with SqlStore.open(url) as store:
        assert store.existed is False
    with SqlStore.open(url) as store:
        assert store.existed is True


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_store_without_a_table_or_a_counter_of_its_schema_is_refused(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = sql_url(kind, request, tmp_path)
    SqlStore.open(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM meta WHERE key = 'submit_seq'"))
    with pytest.raises(StoreDamagedError, match="lacks its counters submit_seq"):
        SqlStore.open(url)
    with engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE notices"))
    engine.dispose()
    with pytest.raises(StoreDamagedError, match="lacks tables its schema revision has: notices"):
        SqlStore.open(url)


def test_a_postgres_database_with_our_tables_but_no_revision_is_refused(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = sql_url("postgres", request, tmp_path)
    SqlStore.open(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE alembic_version"))
    engine.dispose()
    with pytest.raises(StoreDamagedError, match="no schema revision") as caught:
        SqlStore.open(url)
    assert "never drops PostgreSQL data" in caught.value.fix


def test_move_aside_renames_the_store_and_its_side_files_and_deletes_nothing(used: Path) -> None:
    (used.parent / "state.db-wal").write_bytes(b"wal")
    before = used.read_bytes()
    moved = move_aside(used, now=0.0)
    assert [p.name for p in moved] == ["state.db.reset-19700101T000000Z", "state.db.reset-19700101T000000Z-wal"]
    assert moved[0].read_bytes() == before
    assert not used.exists()
    assert move_aside(used) == []


def test_an_online_backup_while_a_writer_keeps_writing_is_whole_and_private(used: Path, tmp_path: Path) -> None:
    store = SqlStore.open(default_sqlite_url(used.parent))
    halt = threading.Event()

    def write() -> None:
        n = 0
        while not halt.is_set():
            store.submit(job(f"w{n}"), at=2.0)
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        first = store.backup(tmp_path / "through-the-store.db")
        second = backup_sqlite_file(used, tmp_path / "from-the-file.db")
    finally:
        halt.set()
        writer.join()
        store.close()
    for info in (first, second):
        assert info.jobs >= 300
        assert oct(info.path.stat().st_mode & 0o777) == "0o600"
        with SqlStore.open(f"sqlite:///{info.path}") as copy:
            assert len(copy.active()) == info.jobs  # every counted job reads back whole
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_backup_to_a_missing_folder_or_of_a_missing_store_is_a_clear_error(used: Path, tmp_path: Path) -> None:
    with pytest.raises(GpufleetError, match="does not exist") as caught:
        backup_sqlite_file(used, tmp_path / "no" / "such" / "b.db")
    assert "create it first" in caught.value.fix
    with pytest.raises(GpufleetError, match="there is no store"):
        backup_sqlite_file(tmp_path / "none.db", tmp_path / "b.db")


def test_a_postgres_store_points_to_pg_dump(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    with SqlStore.open(sql_url("postgres", request, tmp_path)) as store, pytest.raises(GpufleetError) as caught:
        store.backup(tmp_path / "b.db")
    assert "pg_dump --format=custom" in caught.value.fix
