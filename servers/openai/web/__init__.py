"""The HTTP layer: middleware, slow-client and shutdown handling, JSON encoding, metrics."""
