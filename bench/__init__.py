"""Benchmarks: `python -m bench.run` (or `make bench`) runs bench/bench_*.py."""
