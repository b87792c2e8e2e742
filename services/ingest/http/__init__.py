"""What every routes module of ingest shares: the domain errors and the request's dependencies."""
