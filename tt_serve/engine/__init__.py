"""Scheduler, engine, async engine and host sampler. Imports neither torch nor ttnn."""
