"""Alembic migrations for rlrun (one tree for SQLite and PostgreSQL)."""
