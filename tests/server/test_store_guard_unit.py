"""Opening the control plane's store (`server/store_guard.py`) without a server: the data directory's store
id, a record that does not decode, and --reset-store."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.domain import QueueSpec
from gpufleet.server.store_guard import MARKER, StoreRefusedError, open_store
from tests.storage.test_contract import job


def test_the_data_directory_remembers_its_store_and_refuses_another(tmp_path: Path) -> None:
    url = default_sqlite_url(tmp_path / "data")
    first = open_store(tmp_path / "data", url)
    store_id = first.store.get_setting("store_id")
    first.store.close()
    assert (tmp_path / "data" / MARKER).read_text().strip() == store_id
    open_store(tmp_path / "data", url).store.close()  # the same store again: fine
    other = default_sqlite_url(tmp_path / "elsewhere")
    SqlStore.open(other).close()  # a store of no data directory yet
    with pytest.raises(StoreRefusedError, match="is another store") as caught:
        open_store(tmp_path / "data", other)
    assert "--reset-store" in caught.value.fix
    reset = open_store(tmp_path / "data", other, reset=True)
    assert reset.reset
    assert reset.moved  # the other store's file was moved aside, not deleted
    assert [e.action for e in reset.store.audit_log()] == ["store.reset"]
    reset.store.close()


def test_a_record_that_does_not_decode_is_refused_before_the_loop_reads_it(tmp_path: Path) -> None:
    url = default_sqlite_url(tmp_path / "data")
    opened = open_store(tmp_path / "data", url)
    opened.store.set_queue(QueueSpec("default"))
    opened.store.submit(job("a"), at=1.0)
    opened.store.close()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("""UPDATE jobs SET record = '{"job": 7}' WHERE id = 'a'"""))
    engine.dispose()
    with pytest.raises(StoreRefusedError, match="holds a record that cannot be read") as caught:
        open_store(tmp_path / "data", url)
    assert "restore it from a backup" in caught.value.fix
