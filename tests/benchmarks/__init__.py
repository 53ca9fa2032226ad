"""Benchmarks that print figures; run them directly (``python -m tests.benchmarks.bench_api``)."""
