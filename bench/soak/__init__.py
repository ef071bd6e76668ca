"""Soak: one server under a seeded mix of every API for minutes, with leak, status, latency,
drain and cold-reference equivalence checks (``harness.py``)."""
