"""tuneloop evaluator service. Mid-run task evals: generation on held-out data, the rubric judge, scores, best-checkpoint choice and the eval gate."""
