"""A minimal OpenAI-compatible chat server over HF transformers generate: the parity reference for mm-infer."""
