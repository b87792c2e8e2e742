"""Tables owned by the scheduler service (sqlmodel). None yet; each new table comes with an alembic
migration in shared/migrations/versions/."""
