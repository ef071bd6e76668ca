"""The reference numerics of the hybrid model: per-layer math equal to HF (layers, GDN,
attention, MoE) and ``StepPlan``, the step geometry those functions read; every other path is
tested against them. They call the compiled kernels of ``model/kernels`` where available. The
torch backend (``model/torch``) and the ttnn contract build on them; nothing here imports
either."""
