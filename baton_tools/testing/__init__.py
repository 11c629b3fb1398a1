"""Helpers for tests, benchmarks and the demo: real etcd and nats-server processes."""
