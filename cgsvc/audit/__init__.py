"""The append-only, hash-chained audit log (SQLite or PostgreSQL) and plan resources."""
