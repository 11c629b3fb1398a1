"""Benchmarks: each ``bench/<name>.py`` has ``main() -> dict`` (sync or async) that prints a
table and writes ``bench/results/<name>.json``. Run with ``python -m bench [name ...]``."""
