"""The torch reference: one eager forward of the hybrid model (layers, GDN, attention, MoE,
pools, sampling, the screened LM head and its C kernels), the numerical reference every other
path is tested against. ``model/torch_backend.py`` drives it (and ``model/cuda`` when graphs are
on); nothing here imports either."""
