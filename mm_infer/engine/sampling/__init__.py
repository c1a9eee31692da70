"""Sampling: the per-request parameters, one step's batched parameters, logits processing and counter-based draws."""
