"""Model description (spec), checkpoint loading and the backends."""
