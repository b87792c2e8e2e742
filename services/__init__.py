"""tuneloop's services. Each imports `shared`, never another service."""

# First, so that a worker process that imports a service module directly (an OTLP mapping
# process unpickling its function) has shared.accel's finder in place before the service's own
# imports run.
import shared  # noqa: F401
