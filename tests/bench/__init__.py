"""Benchmarks (not tests): run as modules, results go to docs/performance.md."""
