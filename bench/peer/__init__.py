"""Side-by-side harness: tt-serve against a user-supplied llama.cpp ``llama-server``.

Nothing of llama.cpp is part of this project: the user builds ``llama-server`` and converts the
model to GGUF (docs/peer.md), and passes both paths. Run ``python -m bench.peer --help``.

Modules: ``servers`` (start / health / stop one server of either kind), ``measures`` (prompts,
the streaming client, the greedy cross-check and the measures), ``summary`` (medians, ratios,
the Markdown table), ``harness`` (the command line and the interleaved rounds).
"""
