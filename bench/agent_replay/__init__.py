"""The agent replay benchmark (issue 37, item 5): N agents x T turns of chat with a shared
system + tools head, each turn re-sending the whole history, measured as users run it.

* ``workload``: the conversations (a pure function of a seed, lengths calibrated with the model's
  tokenizer) and the two ways a client re-sends an answer (verbatim, re-rendered);
* ``client``: the HTTP side (``/v1/chat/completions``, streaming, one agent = one task);
* ``inprocess``: the same conversations driven through an in-process engine (torch or the ttnn
  backend on its virtual device), no HTTP;
* ``summary``: computed tokens against the issue's bound, per turn and overall, TTFT, makespan;
* ``harness``: the arms, one server start each, the ledger line and the table.

    python -m bench.agent_replay http --arms default,responses,messages,llama.cpp \
        --llama-server BIN --gguf FILE
    python -m bench.agent_replay inprocess --backend ttnn-virtual --chunk 2048

See docs/agents.md ("The agent replay benchmark").
"""
