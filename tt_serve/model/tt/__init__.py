"""ttnn backend for Tenstorrent devices; mirrors ``model/ref`` file for file.

Every ttnn call goes through :class:`tt_serve.model.tt.ops.Ops`, which imports ttnn lazily, so
importing this package needs neither ttnn nor a device.
"""
