"""Alembic migrations of the server's schema (server/models.py); `server.migrate` runs them."""
