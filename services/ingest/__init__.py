"""tuneloop ingest service. HTTP edge: the OpenAI/Anthropic/Gemini-compatible gateway, JSONL upload, OTLP trace receiver, sample store and dataset builder.

Importing it first puts the finder for ingest's compiled hot modules in place when the setting
`accel` opts in (services/ingest/accel), so the service's process and its worker processes (the
OTLP pool's, which import their function from here) load them before any is imported."""

from services.ingest import accel

accel.install_if_opted_in()
