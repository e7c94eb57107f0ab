"""Reproducible benchmarks; each prints ratios against peers run in the same process/run."""
