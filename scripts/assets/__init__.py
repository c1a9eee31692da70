"""Makers of assets/: the tiny checkpoints and their templates, the trained tiny-shapes-vl, test videos, goldens."""
