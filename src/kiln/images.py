"""Image files to pixels with Pillow and numpy only: training (folder data) and ``kiln infer`` (no torch) share it."""

from __future__ import annotations

import numpy as np
from PIL import Image


def pixel_array(image: Image.Image, channels: int, size: tuple[int, int]) -> np.ndarray:
    """A Pillow image as uint8 ``(channels, *size)``: converted, and resized (antialiased when shrinking)."""
    image = image.convert("RGB" if channels == 3 else "L")
    if image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    array = np.asarray(image)
    return (array[None] if array.ndim == 2 else array.transpose(2, 0, 1)).copy()  # contiguous, writable
