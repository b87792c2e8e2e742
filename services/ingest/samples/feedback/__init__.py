"""Feedback on captured samples: `POST /v1/feedback` stores a score and/or a label (and a
comment) for a sample id, which the gateway returns with every captured call
(`x-tuneloop-sample-id`); dataset filters and rejection sampling select by a sample's newest
label and score. `store.py` is the domain (no HTTP), `routes.py` the routes."""
