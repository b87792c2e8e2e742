"""Benchmarks (`make bench`): runnable modules, never collected by pytest (bench_*.py, not
test_*.py). Speed goals live here as printed ratios against a baseline run in the same process."""
