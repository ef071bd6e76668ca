"""Benchmark tools: load generator, A/B harness and run ledger, equivalence checker, plots."""
