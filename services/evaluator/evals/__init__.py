"""The Evals API in OpenAI's shape: evals (an item schema and testing criteria), runs over inline
items, an uploaded file or a dataset's eval split, optionally answered by a model through the
gateway, and each item's grades. Routes in api.py; docs/evaluator.md, "Evals API"."""
