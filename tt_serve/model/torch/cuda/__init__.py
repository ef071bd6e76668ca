"""The torch backend's static-shape path: bucketed programs over persistent input buffers,
captured as CUDA graphs (on CPU the same programs run eagerly: the testable twin).

It builds on the eager forward of ``model/torch`` (``model.py`` and ``pools.py``, over the
numerics of ``model/ref`` and the kernels of ``model/kernels``) and mirrors ``model/tt/runtime``
by name: ``inputs`` (host values of the fixed-shape inputs), ``buffers`` (persistent device
inputs), ``programs`` (capture and replay), ``model`` (the decode and prefill programs).
``TorchBackend`` (``torch/backend.py``) loads it only when graphs are enabled.
"""
