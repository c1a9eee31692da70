"""Drawing primitives: noisy plain backgrounds and filled circles, squares and triangles in named colours."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
    "yellow": (235, 205, 30), "purple": (140, 50, 190),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")


@dataclass(frozen=True)
class Shape:
    """One filled shape: kind, colour name, centre (x, y) and radius in pixels."""

    kind: str
    colour: str
    x: float
    y: float
    r: float


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """uint8 [size, size, 3]: a light, slightly tinted plain colour, sometimes with mild Gaussian noise."""
    base = rng.uniform(170, 245) + rng.uniform(-8, 8, size=3)  # [3]
    img = np.broadcast_to(base, (size, size, 3)).astype(np.float64)
    noise_std = rng.choice([0.0, 0.0, 3.0, 6.0])
    if noise_std > 0:
        img = img + rng.normal(0.0, noise_std, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def jittered_colour(rng: np.random.Generator, name: str) -> tuple[int, int, int]:
    rgb = np.asarray(COLOURS[name], dtype=np.float64) + rng.uniform(-15, 15, size=3)
    return tuple(int(c) for c in np.clip(np.rint(rgb), 0, 255))


def draw(canvas: np.ndarray, shapes: list[Shape], fills: list[tuple[int, int, int]]) -> np.ndarray:
    """A copy of `canvas` [H, W, 3] with `shapes` drawn in order, each in its fill colour."""
    img = Image.fromarray(canvas)
    pen = ImageDraw.Draw(img)
    for s, fill in zip(shapes, fills, strict=True):
        box = (s.x - s.r, s.y - s.r, s.x + s.r, s.y + s.r)
        if s.kind == "circle":
            pen.ellipse(box, fill=fill)
        elif s.kind == "square":
            pen.rectangle(box, fill=fill)  # full box: its corners are what tells it from a circle
        elif s.kind == "triangle":
            pen.polygon([(s.x, s.y - s.r), (s.x - s.r, s.y + 0.8 * s.r), (s.x + s.r, s.y + 0.8 * s.r)], fill=fill)
        else:
            raise ValueError(f"unknown shape kind {s.kind!r}")
    return np.asarray(img)


def place(rng: np.random.Generator, size: int, radii: list[float], tries: int = 200) -> list[tuple[float, float]]:
    """Centres for shapes of the given radii, inside the canvas and not touching each other."""
    centres: list[tuple[float, float]] = []
    for r in radii:
        for _ in range(tries):
            x, y = rng.uniform(r + 2, size - r - 2, size=2)
            if all((x - cx) ** 2 + (y - cy) ** 2 > (r + cr + 4) ** 2
                   for (cx, cy), cr in zip(centres, radii, strict=False)):
                centres.append((float(x), float(y)))
                break
        else:
            raise RuntimeError(f"could not place {len(radii)} shapes on a {size}px canvas")
    return centres
