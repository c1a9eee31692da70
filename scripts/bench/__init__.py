"""Benchmarks and measurements; most compare against a peer (HF, vLLM, another checkout) in one run, ratio last."""
