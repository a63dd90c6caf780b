"""Whether a database's schema is the one this gpuprov reads, for the commands that only read
(or change a row of) the database and must never migrate it themselves.

    head_revision()     the latest migration this gpuprov knows (Alembic's head)
    open_current(url)   the database at `url`, its schema at that head; else one line saying
                        where it is and what to run (DatabaseBehind), or why it cannot be opened
                        (DatabaseUnavailable), never its password

The processes that own the schema migrate it when they start (`gpuprov setup`, `gpuprov dev`,
the worker and `gpuprov api`: `Database.upgrade`, gpuprov/store/db.py). A user command that met
an older schema used to fail on the first missing table ("no such table: log_chunks"); this
names the revision instead, and the command that brings it to the head.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import make_url

from gpuprov.store.db import Database, DatabaseUnavailable, alembic_config, unavailable

MIGRATE = "run `gpuprov setup` (it migrates the database first; `gpuprov dev` does so at start)"


class DatabaseBehind(DatabaseUnavailable):
    """The database's schema is not the one this gpuprov reads: older, empty, or newer."""


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships its migrations
        raise RuntimeError("gpuprov ships no migrations")
    return head


def _known(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:
        return False


def _missing_sqlite_file(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    if parsed.database == ":memory:" or parsed.database.startswith("file:"):
        return None
    file = Path(parsed.database).expanduser()
    return None if file.exists() else file


def behind(url: str, revision: str | None, head: str) -> DatabaseBehind:
    """What to say about a database at `revision` where gpuprov reads `head`."""
    shown = make_url(url).render_as_string(hide_password=True)
    if revision is None:
        return DatabaseBehind(f"the database at {shown} has no gpuprov tables yet: {MIGRATE}")
    if not _known(revision):
        return DatabaseBehind(
            f"the database at {shown} is at revision {revision}, which this gpuprov does not "
            f"know (it reads {head}): upgrade gpuprov"
        )
    return DatabaseBehind(
        f"the database at {shown} is at revision {revision}, gpuprov needs {head}: {MIGRATE}"
    )


def open_current(url: str) -> Database:
    """The database at `url` without migrating it: DatabaseBehind unless its schema is at this
    gpuprov's head, DatabaseUnavailable when it cannot be reached. A SQLite file that does not
    exist is not created."""
    head = head_revision()
    if (missing := _missing_sqlite_file(url)) is not None:
        shown = make_url(url).render_as_string(hide_password=True)
        raise DatabaseBehind(
            f"there is no database at {shown} ({missing} does not exist): {MIGRATE}"
        )
    database: Database | None = None
    try:
        database = Database(url)
        revision = database.current_revision()
    except (sa.exc.DBAPIError, OSError) as error:
        if database is not None:
            database.dispose()
        raise unavailable(url, error) from None
    if revision != head:
        database.dispose()
        raise behind(url, revision, head)
    return database
