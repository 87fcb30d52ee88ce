"""Migrations: a fresh database ends at head and matches the schema; opening again is a no-op; databases
that cannot be used are refused with a fix."""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpufleet.adapters.storage.schema import metadata
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.adapters.storage.sql_engine import alembic_config, head_revision, make_engine, parse_url
from gpufleet.domain import GpufleetError, QueueSpec
from tests.storage.conftest import SQL_KINDS, sql_url
from tests.storage.test_contract import job


@pytest.fixture(params=SQL_KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return sql_url(request.param, request, tmp_path, migrated=False)


def revision_and_diff(url: str) -> tuple[str | None, list[object]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return context.get_current_revision(), list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_a_fresh_database_is_at_head_and_matches_the_schema(url: str) -> None:
    SqlStore.open(url).close()
    revision, diff = revision_and_diff(url)
    assert revision == head_revision()
    assert diff == []


def test_alembic_sees_no_change_to_migrate(url: str) -> None:
    """`alembic check` through the developers' configuration: the models need no new migration."""
    SqlStore.open(url).close()
    command.check(alembic_config(url))


def test_opening_again_keeps_everything(url: str) -> None:
    with SqlStore.open(url) as store:
        store.set_queue(QueueSpec("default"))
        store.submit(job("a"), at=1.0)
        version = store.cluster_version()
    with SqlStore.open(url) as store:
        assert store.get("a") is not None
        assert store.cluster_version() == version
        assert store.submit(job("b"), at=2.0).job.submit_seq == 2
    assert revision_and_diff(url) == (head_revision(), [])


def test_concurrent_first_opens_migrate_once(url: str) -> None:
    opened: list[SqlStore] = []
    failures: list[BaseException] = []

    def open_it() -> None:
        try:
            opened.append(SqlStore.open(url))
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in opened:
        store.close()
    assert failures == [], [str(failure) for failure in failures]
    assert len(opened) == 4
    assert revision_and_diff(url) == (head_revision(), [])


def test_a_database_from_a_newer_gpufleet_is_refused(url: str) -> None:
    SqlStore.open(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(GpufleetError, match="cannot be brought up to date") as caught:
        SqlStore.open(url)
    assert "newer" in caught.value.fix


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("not a url", "cannot be read"),
        ("postgresql://u@h:port/db", "cannot be read"),
        ("mysql://u@h/db", "'mysql' is not supported"),
        ("postgresql+asyncpg://u@h/db", "'postgresql+asyncpg' is not supported"),
        ("sqlite+aiosqlite:///x.db", "'sqlite+aiosqlite' is not supported"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
    ],
)
def test_unusable_urls_are_refused_with_a_fix(bad: str, said: str) -> None:
    with pytest.raises(GpufleetError, match=re.escape(said)) as caught:
        SqlStore.open(bad)
    assert "sqlite:///" in caught.value.fix


def test_an_unreachable_server_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        with pytest.raises(GpufleetError, match="cannot open the database") as caught:
            SqlStore.open(f"postgresql://someone:secret@127.0.0.1:{port}/db")
    assert "secret" not in str(caught.value)
    assert "postgresql+psycopg://someone:***@127.0.0.1" in str(caught.value)
    assert "check that the database server runs" in caught.value.fix


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(GpufleetError, match="is not a SQLite database") as caught:
        SqlStore.open(f"sqlite:///{path}")
    assert "--reset-store" in caught.value.fix


def test_default_sqlite_url_is_absolute_and_open_creates_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = default_sqlite_url(Path("data/sub"))
    assert url == f"sqlite:///{tmp_path}/data/sub/state.db"
    with SqlStore.open(url) as store:
        assert store.queues() == ()
    assert (tmp_path / "data" / "sub" / "state.db").is_file()


def test_a_folder_that_cannot_be_made_is_a_clear_error() -> None:
    with pytest.raises(GpufleetError, match="cannot create the folder /proc/nope") as caught:
        SqlStore.open("sqlite:////proc/nope/state.db")
    assert "folder you can write to" in caught.value.fix


def test_a_database_of_the_previous_revision_is_brought_to_head_with_its_jobs(url: str) -> None:
    """0003 -> 0004 on a database in use: the audit and idempotency tables appear, nothing is lost."""
    engine = make_engine(parse_url(url))
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, "0003")
            queue = '{"name": "default", "quotas": {}, "cohort": null, "weight": 1.0}'
            connection.execute(sa.text("INSERT INTO queues (name, spec) VALUES ('default', :spec)"), {"spec": queue})
    finally:
        engine.dispose()
    with SqlStore.open(url) as store:
        assert revision_and_diff(url) == (head_revision(), [])
        assert store.queues() == (QueueSpec("default"),)
        store.submit(job("a"), at=1.0)
    with SqlStore.open(url) as store:
        assert [r.id for r in store.active()] == ["a"]
        assert store.audit_log() == []


def test_jobs_stored_before_0003_get_their_priority_and_an_unknown_submitter(url: str) -> None:
    from gpufleet.adapters.storage.codec import encode_record
    from gpufleet.domain.lifecycle import JobState
    from gpufleet.domain.records import JobRecord
    from gpufleet.ports.admin import JobQuery

    command.upgrade(alembic_config(url), "0002")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO queues (name, spec) VALUES ('default', :spec)"), {"spec": "{}"})
            for seq, (job_id, priority) in enumerate((("low", 0), ("high", 7)), start=1):
                record = encode_record(JobRecord(job(job_id, priority=priority, submit_seq=seq), JobState.PENDING))
                del record["job"]["user"]  # as written before the submitter was recorded
                connection.execute(
                    sa.text(
                        "INSERT INTO jobs (id, seq, queue, name, state, version, submitted_at, record) "
                        "VALUES (:id, :seq, 'default', '', 'pending', 1, 0, :record)"
                    ),
                    {"id": job_id, "seq": seq, "record": json.dumps(record)},
                )
    finally:
        engine.dispose()
    with SqlStore.open(url) as store:  # migrates to head
        assert store.pending_ahead("default", 0, 1, 10) == (1, ["high"])
        assert store.pending_ahead("default", 7, 2, 10) == (0, [])
        assert [r.job.user for r in store.jobs(JobQuery(user=""))] == ["", ""]
