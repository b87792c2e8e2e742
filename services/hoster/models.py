"""Tables owned by the hoster service (sqlmodel). None yet; each new table comes with an alembic
migration in shared/migrations/versions/."""
