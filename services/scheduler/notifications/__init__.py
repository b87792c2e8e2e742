"""Alerts that reach a person: tenants' notification rules and their delivery.

    schemas.py    the API's shapes (rules, deliveries)
    rules.py      the rules store (tenant-scoped; where a URL may point)
    matching.py   which bus facts are alerts, and which rules they reach
    checks.py     facts found by looking: stuck jobs, budget percentages reached
    bodies.py     the bodies sent: ours (json) or a Slack incoming webhook's
    signing.py    Standard Webhooks signatures
    outbox.py     deliveries, durable in the database, and their attempts
    delivery.py   sending them: timeouts, bounded concurrency, retries with backoff
    notifier.py   facts in, deliveries out; the loops
    handlers.py   bus subscribers;  routes.py  HTTP routes;  metrics.py  /metrics

docs/alerts.md says what a tenant and a receiver see.
"""
