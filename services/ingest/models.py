"""Tables owned by the ingest service (sqlmodel). None yet; each new table comes with an alembic
migration in shared/migrations/versions/."""
