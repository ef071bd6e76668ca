"""Deployment planning: the backend's startup and a short workload on the virtual device."""
