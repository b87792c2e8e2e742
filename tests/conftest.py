"""Session fixtures: real NATS and S3 (tests/plugins/infra.py), tiny models (tests/plugins/models.py),
databases (tests/plugins/database.py)."""

import os

# Unset, TUNELOOP_ENV means production, which refuses the development secrets every test uses;
# set here, before anything loads settings, so the processes tests spawn inherit it too.
os.environ["TUNELOOP_ENV"] = "development"

pytest_plugins = [
    "tests.plugins.infra",
    "tests.plugins.models",
    "tests.plugins.database",
]
