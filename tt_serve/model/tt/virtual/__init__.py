"""The device model: tt-metal's op rules, the DRAM model, the virtual ttnn device (one op family a
module, composed in ``device.py``) and mesh; the boards they describe are ``model/tt/boards.py``."""
