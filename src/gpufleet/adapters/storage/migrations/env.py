"""Alembic environment of the SQL store.

`SqlStore.open` runs the migrations programmatically on a connection it passes in
`config.attributes["connection"]`, inside a transaction it holds (and, on PostgreSQL, under an advisory
lock, so that two processes opening the same database migrate it once). For developers, the alembic
command line works too with `-x url=…` or `sqlalchemy.url` set, e.g. to autogenerate a revision:

    alembic -c /dev/null -x url=sqlite:///dev.db revision --autogenerate -m "what changed"

(run from this directory, with `script_location` pointing here).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from gpufleet.adapters.storage.schema import metadata

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
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database: pass -x url=sqlite:///path/state.db (or postgresql+psycopg://…)")
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            _migrate(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run them against a database")
_main()
