"""The torch backend's static-shape path: bucketed programs over persistent input buffers,
captured as CUDA graphs (on CPU the same programs run eagerly: the testable twin).

It builds on the eager reference in ``model/ref`` (same kernels and pools) and mirrors
``model/tt`` by name: ``inputs`` (host values of the fixed-shape inputs), ``buffers``
(persistent device inputs), ``programs`` (capture and replay), ``model`` (the decode and
prefill programs). ``TorchBackend`` loads it only when graphs are enabled.
"""
