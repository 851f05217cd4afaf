"""Benchmarks of the Python client: ``python -m strata.bench``."""
