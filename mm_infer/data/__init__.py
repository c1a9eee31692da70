"""Synthetic shapes dataset (CLEVR-like images and moving-shape videos) for training and scoring tiny VLMs."""

from mm_infer.data.chat import ChatEncoder, Example
from mm_infer.data.tasks import IMAGE_TASKS, TASKS, VIDEO_TASKS, Sample, make_sample, make_split

__all__ = ["IMAGE_TASKS", "TASKS", "VIDEO_TASKS", "ChatEncoder", "Example", "Sample", "make_sample", "make_split"]
