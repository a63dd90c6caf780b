"""Alembic environment: migrations always run online, on a connection gpuprov hands over.

`Database.upgrade()` passes its connection in `config.attributes["connection"]`; the alembic CLI
(gpuprov/store/migrations/alembic.ini) gets one from gpuprov's settings instead. Either way the
migration first takes a database-wide lock, so two processes starting at once (worker and API)
migrate one after the other instead of both creating the same tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from gpuprov.store.db import metadata

# Any fixed 64-bit number works; it only has to be the same in every gpuprov process.
PG_MIGRATION_LOCK = 0x67707570726F76  # "gpuprov"


def _lock(connection: sa.Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})"))
    elif connection.dialect.name == "sqlite" and not connection.in_transaction():
        # pysqlite would start the transaction lazily (and not at all for DDL); take the write
        # lock now so the version check and the DDL happen under it.
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _run(connection: sa.Connection) -> None:
    _lock(connection)
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from gpuprov.config import load_settings
    from gpuprov.store.db import Database

    database = Database(load_settings().database.url)
    try:
        with database.engine.connect() as connection:
            _run(connection)
            connection.commit()
    finally:
        database.dispose()


if context.is_offline_mode():
    raise SystemExit("gpuprov migrations run online only (Database.upgrade())")
main()
