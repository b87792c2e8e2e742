"""tuneloop hoster service. Model registry (versions, lineage, stages), deployments and inference engines behind OpenAI-compatible endpoints."""
