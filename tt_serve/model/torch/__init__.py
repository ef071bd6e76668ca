"""The torch backend: ``TorchBackend`` (``backend.py``) over the eager forward of the hybrid
model (``model.py``: ``HybridModel`` over the paged ``pools``, with the screened LM head of
``screen.py``), its device picks and draws (``outputs``, ``sampling``), the step in flight
(``pending``), the host-memory KV sizing (``launch.py``), and the static-shape programs run as
CUDA graphs (``cuda/``). Built on the reference numerics of ``model/ref`` and the compiled
kernels of ``model/kernels``; neither imports anything from here.
"""
