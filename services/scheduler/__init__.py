"""tuneloop scheduler service. Fine-tuning jobs API, dataset analysis into a recipe, the GPU priority ladder, attempts, rollover, recovery and the signed-webhook receiver."""
