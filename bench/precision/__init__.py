"""What a lower precision costs in output quality: the ttnn profiles on the virtual device in the
card's formats (``cost``), the torch backend in bfloat16 (``drift``), and the golden tier's
per-op check (``check_numerics``), each against the float32 reference.
"""
