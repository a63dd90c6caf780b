"""Durable state: the database, its tables and migrations, and the records each feature keeps."""
