"""Alembic environment of the SQL store.

`SqlStore.open` runs the migrations programmatically on a connection it passes in
`config.attributes["connection"]`, inside a transaction it holds (and, on PostgreSQL, under an advisory
lock, so that two processes opening the same database migrate it once). Alembic's own commands, given
`engine.alembic_config(url)`, open the database from `sqlalchemy.url` instead; see that function for how
to write a new migration.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from gpufleet.adapters.storage.schema import metadata
from gpufleet.adapters.storage.sql_engine import make_engine, parse_url

config = context.config


def _migrate(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _migrate(given)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database: build the configuration with engine.alembic_config(url)")
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as connection:
            _migrate(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run them against a database")
_main()
