"""Benchmarks: each module has a `run_*_benchmark` function returning a dict and a `main(argv)` CLI entry."""
