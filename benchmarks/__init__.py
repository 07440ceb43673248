"""django_locks' benchmarks against the round-trip floor and the peers: ``python -m benchmarks``."""
