"""HTTP layer: FastAPI app, protocol models, metrics, and the serve entry point."""
