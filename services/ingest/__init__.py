"""tuneloop ingest service. HTTP edge: the OpenAI/Anthropic/Gemini-compatible gateway, JSONL upload, OTLP trace receiver, sample store and dataset builder."""
