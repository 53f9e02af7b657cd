"""Flower round-trip benchmark app (see benchmarks/bench_flower.py)."""
