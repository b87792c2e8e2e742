"""The generated references in docs/reference/: configuration, events, AsyncAPI and OpenAPI.

Each document is built from the code that defines it (the settings classes, shared/events.py,
the services' own FastAPI apps and FastStream brokers), so it cannot say something the code does
not do. `make docs` (`python -m shared.dev.docs_gen`) rewrites them; tests/shared/test_docs_gen.py
fails when a committed one differs from what the code makes now. The services are imported by
name, as shared.db imports their table modules: shared never imports a service statically.
"""
