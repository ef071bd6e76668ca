"""Benchmark tools, one package per thing measured: ``cache``, ``scheduling``, ``kernels``,
``precision``, ``capacity``, ``load`` (the load generator, A/B rounds, router), ``peer``,
``agent_replay``, ``gpu``; ``common`` is what they share (see bench/README.md)."""
