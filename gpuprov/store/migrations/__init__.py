"""Alembic migrations for gpuprov's database; run them with `Database.upgrade()`."""
