"""mm-infer: exact, fast multimodal (image + video) LLM inference for RL rollouts."""

__version__ = "0.1.0"
