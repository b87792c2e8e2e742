"""tuneloop hoster service. Model registry (versions, lineage, aliases), deployments and inference engines behind OpenAI-compatible endpoints."""
