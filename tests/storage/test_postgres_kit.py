"""The PostgreSQL test server helper: a missing installation is a failure that says what to install, and
only an explicit GPUFLEET_TEST_POSTGRES=0 turns the PostgreSQL tests off."""

from __future__ import annotations

import pytest

from tests.kit import postgres


def test_missing_binaries_say_to_install_postgresql(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres.shutil, "which", lambda _name: None)
    monkeypatch.setattr(postgres.glob, "glob", lambda _pattern: [])
    with pytest.raises(postgres.PostgresUnavailableError, match="install Debian's `postgresql` package"):
        postgres.find_bin_dir()


@pytest.mark.parametrize(("value", "off"), [(None, False), ("1", False), ("0", True), ("false", True), ("off", True)])
def test_only_an_explicit_setting_opts_out(monkeypatch: pytest.MonkeyPatch, value: str | None, off: bool) -> None:
    if value is None:
        monkeypatch.delenv(postgres.OPT_OUT, raising=False)
    else:
        monkeypatch.setenv(postgres.OPT_OUT, value)
    assert postgres.opted_out() is off


def test_the_server_answers(postgres_server: postgres.PostgresServer) -> None:
    import psycopg

    url = postgres_server.create_database()
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(f"host=127.0.0.1 port={postgres_server.port} user=postgres dbname={database}") as c:
        assert c.execute("SELECT current_database()").fetchone() == (database,)
    postgres_server.drop_database(url)
