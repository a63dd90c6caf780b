"""Every row of every table of a gpuprov database, for tests that prove a request changed
nothing (or exactly one thing).

The tables are reflected from the database itself, so a table a migration adds is never
missed. Reflection (every column, key and index) costs far more than reading the rows of a
test database, and the schema does not change under a test's requests, so it is kept per
engine and done again only when the list of tables changes.
"""

from __future__ import annotations

import weakref
from typing import Any

import sqlalchemy as sa

from gpuprov.store.db import Database
from gpuprov.store.records import Records

_REFLECTED: weakref.WeakKeyDictionary[sa.Engine, sa.MetaData] = weakref.WeakKeyDictionary()


def _tables(engine: sa.Engine) -> sa.MetaData:
    names = set(sa.inspect(engine).get_table_names())
    reflected = _REFLECTED.get(engine)
    if reflected is None or set(reflected.tables) != names:
        reflected = sa.MetaData()
        reflected.reflect(engine)
        _REFLECTED[engine] = reflected
    return reflected


def snapshot(store: Records | Database) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, by table, each table's rows in a stable order."""
    db = store.db if isinstance(store, Records) else store
    reflected = _tables(db.engine)
    with db.engine.connect() as connection:
        return {
            table.name: sorted(
                (tuple(row) for row in connection.execute(sa.select(table))), key=repr
            )
            for table in reflected.sorted_tables
        }
