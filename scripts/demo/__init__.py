"""Demos on the tiny model: a GRPO loop on CPU (grpo.py) and accuracy through HF, offline and a server."""
