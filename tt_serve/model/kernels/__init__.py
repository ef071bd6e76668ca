"""Compiled kernels the torch numerics call where they are available: today the C kernels on
the CPU (``native.c``, compiled at first use and called via ctypes by ``native.py``); room for
CUDA kernels later. A speed-up, never a requirement: callers keep their torch path.

A leaf: it imports only torch and ``tt_serve.user_cache``, nothing from ``tt_serve.model``, so
both the reference numerics (``model/ref``) and the torch backend (``model/torch``) may call it.
"""
