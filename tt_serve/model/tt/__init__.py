"""ttnn backend for Tenstorrent devices; mirrors ``model/ref`` (eager layers, backend, pools,
pending) and ``model/torch/cuda`` (inputs, buffers, programs) by file name.

Every ttnn call goes through :class:`tt_serve.model.tt.ops.Ops`, which imports ttnn lazily, so
importing this package needs neither ttnn nor a device.
"""
