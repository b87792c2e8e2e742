"""Datasets: the spec, selection, cleaning, the split, the build worker and versioned snapshots."""
