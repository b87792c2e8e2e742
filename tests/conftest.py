"""Session fixtures: real NATS and S3 (tests/plugins/infra.py), tiny models (tests/plugins/models.py),
databases (tests/plugins/database.py)."""

pytest_plugins = [
    "tests.plugins.infra",
    "tests.plugins.models",
    "tests.plugins.database",
]
