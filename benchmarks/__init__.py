"""Benchmarks: each prints its result as a ratio against a floor measured in the same run."""
