"""The ttnn device program: layers, the model, pools, buffers, programs and the backend."""
