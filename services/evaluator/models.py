"""Tables owned by the evaluator service (sqlmodel). None yet; each new table comes with an alembic
migration in shared/migrations/versions/."""
