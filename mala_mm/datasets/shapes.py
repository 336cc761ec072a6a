"""Drawing of the built-in shapes dataset: textured backgrounds and filled shape polygons.

Every function takes a ``numpy.random.Generator`` so that a scene is a pure function of its seed.
"""
from typing import List, Tuple

import cv2
import numpy as np
from pycocotools import mask as mask_utils

CLASSES = ('circle', 'square', 'triangle', 'star')
PALETTE = [(220, 20, 60), (0, 128, 255), (60, 180, 75), (255, 180, 0)]


def shape_polygon(name: str, center: Tuple[float, float], radius: float, angle: float) -> np.ndarray:
    """Vertices (K, 2) as (x, y) of a shape inscribed in a circle of ``radius``, rotated by ``angle``."""
    if name == 'circle':
        radii, count = [radius], 40
    elif name == 'square':
        radii, count = [radius], 4
    elif name == 'triangle':
        radii, count = [radius], 3
    elif name == 'star':  # five points, alternating outer and inner vertices
        radii, count = [radius, 0.42 * radius], 10
    else:
        raise ValueError(f'unknown shape {name!r}; choose one of {CLASSES}')
    theta = angle + 2 * np.pi * np.arange(count) / count
    r = np.resize(radii, count)
    return np.stack([center[0] + r * np.cos(theta), center[1] + r * np.sin(theta)], axis=1)


def polygon_rle(polygon: np.ndarray, height: int, width: int) -> dict:
    """The polygon rasterised as COCO does it, so that annotations and pixels agree exactly."""
    return mask_utils.merge(mask_utils.frPyObjects([polygon.ravel().tolist()], height, width))


def _two_colors(rng: np.random.Generator) -> np.ndarray:
    """Two muted colours near each other: backgrounds vary in texture and tint but stay less saturated than
    the shapes, whose colour carries part of their class."""
    gray = rng.uniform(40, 215)
    first = (gray + rng.uniform(-25, 25, 3)).clip(0, 255)
    return np.stack([first, (first + rng.uniform(-60, 60) + rng.uniform(-10, 10, 3)).clip(0, 255)])


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A (size, size, 3) float image: a gradient, noise, stripes, a checkerboard or smooth clouds."""
    kind = rng.choice(['gradient', 'noise', 'stripes', 'checker', 'clouds'])
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    a, b = _two_colors(rng)
    if kind == 'gradient':
        direction = rng.uniform(0, 2 * np.pi)
        t = (xs * np.cos(direction) + ys * np.sin(direction))
        t = (t - t.min()) / (t.max() - t.min())
    elif kind == 'noise':
        t = cv2.GaussianBlur(rng.uniform(0, 1, (size, size)).astype(np.float32), (0, 0), rng.uniform(0.5, 2))
    elif kind == 'stripes':
        direction, freq = rng.uniform(0, np.pi), rng.uniform(3, 12)
        t = 0.5 + 0.5 * np.sin(2 * np.pi * freq * (xs * np.cos(direction) + ys * np.sin(direction)))
    elif kind == 'checker':
        cells = int(rng.integers(3, 10))
        t = ((np.floor(xs * cells) + np.floor(ys * cells)) % 2).astype(np.float32)
    else:  # clouds: coarse noise upsampled
        coarse = rng.uniform(0, 1, (int(rng.integers(3, 8)),) * 2).astype(np.float32)
        t = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC).clip(0, 1)
    return a + (b - a) * t[..., None]


def shape_fill(rng: np.random.Generator, size: int, label: int) -> np.ndarray:
    """A shaded (size, size, 3) fill around the class's colour, jittered per object.

    Colour and outline both tell the classes apart, so that a from-scratch model learns them within a few
    hundred iterations; the jitter and shading keep it from being a colour lookup alone.
    """
    color = np.array(PALETTE[label][::-1], dtype=np.float32) + rng.uniform(-30, 30, 3)  # BGR, as cv2 writes
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    direction = rng.uniform(0, 2 * np.pi)
    shading = 40 * (xs * np.cos(direction) + ys * np.sin(direction) - 0.5)
    return color + shading[..., None]


def draw_scene(rng: np.random.Generator, size: int, max_objects: int) -> Tuple[np.ndarray, List[dict]]:
    """One image (uint8 BGR) and its objects, each ``dict(label, polygon, rle, mask)``; objects do not
    overlap."""
    image = background(rng, size)
    occupied = np.zeros((size, size), dtype=bool)
    objects = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        label = int(rng.integers(len(CLASSES)))
        for _attempt in range(20):
            radius = rng.uniform(0.13, 0.26) * size
            center = rng.uniform(radius, size - radius, 2)
            # rounded as the annotation file stores it, so that the file rasterises to these very pixels
            polygon = np.round(shape_polygon(CLASSES[label], center, radius, rng.uniform(0, 2 * np.pi)), 2)
            rle = polygon_rle(polygon, size, size)
            mask = mask_utils.decode(rle).astype(bool)
            # a margin of a few pixels keeps the shapes apart, so that each mask is the whole shape
            if not (cv2.dilate(mask.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool) & occupied).any():
                break
        else:
            continue
        image[mask] = shape_fill(rng, size, label)[mask]
        occupied |= mask
        objects.append(dict(label=label, polygon=polygon, rle=rle, mask=mask))
    image += rng.normal(0, rng.uniform(2, 12), image.shape)
    return image.clip(0, 255).astype(np.uint8), objects
