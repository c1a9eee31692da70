"""The four tasks (image colour / shape / count, video direction): seeded samples with a question and answer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mm_infer.data.shapes import COLOURS, SHAPES, Shape, background, draw, jittered_colour, place

IMAGE_TASKS: tuple[str, ...] = ("colour", "shape", "count")
VIDEO_TASKS: tuple[str, ...] = ("direction",)
TASKS: tuple[str, ...] = IMAGE_TASKS + VIDEO_TASKS
QUESTIONS: dict[str, str] = {
    "colour": "What colour is the shape?",
    "shape": "What shape is it?",
    "count": "How many shapes?",
    "direction": "Which way does the shape move?",
}
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
IMAGE_SIZE = 112
VIDEO_FRAMES = 4
MAX_COUNT = 4


@dataclass(frozen=True)
class Sample:
    """One question: `media` is uint8 [H, W, 3] for image tasks, [T, H, W, 3] frames for video tasks."""

    task: str
    question: str
    answer: str
    media: np.ndarray

    @property
    def modality(self) -> str:
        return "video" if self.task in VIDEO_TASKS else "image"


def _single(rng: np.random.Generator, size: int) -> tuple[np.ndarray, Shape]:
    kind, colour = SHAPES[rng.integers(len(SHAPES))], list(COLOURS)[rng.integers(len(COLOURS))]
    r = float(rng.uniform(18, 30))
    (x, y), = place(rng, size, [r])
    shape = Shape(kind, colour, x, y, r)
    return draw(background(rng, size), [shape], [jittered_colour(rng, colour)]), shape


def _count(rng: np.random.Generator, size: int) -> tuple[np.ndarray, str]:
    """1..MAX_COUNT shapes of one kind and near-equal size (so a tiny model can count by area), any colours."""
    n, kind = int(rng.integers(1, MAX_COUNT + 1)), SHAPES[rng.integers(len(SHAPES))]
    radii = [float(rng.uniform(10, 12)) for _ in range(n)]
    shapes = [Shape(kind, list(COLOURS)[rng.integers(len(COLOURS))], x, y, r)
              for (x, y), r in zip(place(rng, size, radii), radii, strict=True)]
    return draw(background(rng, size), shapes, [jittered_colour(rng, s.colour) for s in shapes]), str(n)


def _direction(rng: np.random.Generator, size: int, frames: int) -> tuple[np.ndarray, str]:
    """A shape moving a fixed step per frame in one of four directions over a static background."""
    name = list(DIRECTIONS)[rng.integers(len(DIRECTIONS))]
    dx, dy = DIRECTIONS[name]
    r, step = float(rng.uniform(9, 13)), float(rng.uniform(18, 22))  # the two temporal patches ~1.5 tokens apart
    travel = step * (frames - 1)
    lo, hi = r + 2, size - r - 2
    x0 = rng.uniform(lo + max(0.0, -dx * travel), hi - max(0.0, dx * travel))
    y0 = rng.uniform(lo + max(0.0, -dy * travel), hi - max(0.0, dy * travel))
    kind, colour = SHAPES[rng.integers(len(SHAPES))], list(COLOURS)[rng.integers(len(COLOURS))]
    bg, fill = background(rng, size), jittered_colour(rng, colour)
    video = np.stack([draw(bg, [Shape(kind, colour, x0 + dx * step * i, y0 + dy * step * i, r)], [fill])
                      for i in range(frames)])  # [T, H, W, 3]
    return video, name


def make_sample(seed: int, index: int, task: str) -> Sample:
    """Sample `index` of task `task` under `seed`: the same arguments always give the same pixels and answer."""
    rng = np.random.default_rng([seed, TASKS.index(task), index])
    if task == "colour":
        img, shape = _single(rng, IMAGE_SIZE)
        return Sample(task, QUESTIONS[task], shape.colour, img)
    if task == "shape":
        img, shape = _single(rng, IMAGE_SIZE)
        return Sample(task, QUESTIONS[task], shape.kind, img)
    if task == "count":
        img, answer = _count(rng, IMAGE_SIZE)
        return Sample(task, QUESTIONS[task], answer, img)
    if task == "direction":
        video, answer = _direction(rng, IMAGE_SIZE, VIDEO_FRAMES)
        return Sample(task, QUESTIONS[task], answer, video)
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def make_split(seed: int, per_task: int, tasks: tuple[str, ...] = TASKS) -> list[Sample]:
    """`per_task` samples of each task, tasks interleaved."""
    return [make_sample(seed, i, t) for i in range(per_task) for t in tasks]
