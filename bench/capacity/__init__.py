"""What fits where: the deployment table of ``tt-serve plan`` (``plan_table``), which published
model fits which chip or mesh, at which batch and precision.
"""
