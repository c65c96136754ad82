"""Image files to pixels with Pillow and numpy only: training (folder data) and ``kiln infer`` (no torch) share it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from kiln.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")


def image_files(folder: Path) -> list[Path]:
    """Every image file below ``folder``, in a fixed (sorted) order."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def pixel_array(image: Image.Image, channels: int, size: tuple[int, int]) -> np.ndarray:
    """A Pillow image as uint8 ``(channels, *size)``: converted, and resized (antialiased when shrinking)."""
    image = image.convert("RGB" if channels == 3 else "L")
    if image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    array = np.asarray(image)
    return (array[None] if array.ndim == 2 else array.transpose(2, 0, 1)).copy()  # contiguous, writable


def decode_array(path: Path, channels: int, size: tuple[int, int]) -> np.ndarray:
    """One image file as uint8 ``(channels, *size)``; one that does not decode raises ``DataError`` naming it.

    Pillow decodes (torchvision's own image decoding is deprecated since 0.29).
    """
    try:
        with Image.open(path) as image:
            image.load()  # the whole file: a truncated one fails here
            return pixel_array(image, channels, size)
    except (OSError, SyntaxError, ValueError) as err:  # truncated, corrupt or not an image at all
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"{path}: unreadable or truncated image ({reason})") from None
