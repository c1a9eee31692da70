"""The serving engine: requests, scheduling, paged KV, caches, sampling, and the three entry points."""
