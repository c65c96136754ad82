"""Image files to pixels with Pillow and numpy only: training (folder data) and ``kiln infer`` (no torch) share it."""

from __future__ import annotations

import colorsys
import shutil
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image

from kiln.errors import DataError, first_line

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")


def image_files(folder: Path) -> list[Path]:
    """Every image file below ``folder``, in a fixed (sorted) order."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def _eight_bit(image: Image.Image) -> Image.Image:
    """A 16-bit grey image (``I;16``, or ``I`` within 0-65535) scaled to 8 bits over its whole range: Pillow's own
    conversion clips every value above 255, which saturates a 16-bit image to black and white."""
    if not image.mode.startswith("I"):
        return image
    values = np.asarray(image)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise ValueError(f"{image.mode} pixels from {values.min()} to {values.max()}: not 8- or 16-bit")
    return Image.fromarray(np.round(values.astype(np.float64) * (255 / 65535)).astype(np.uint8), "L")


def pixel_array(image: Image.Image, channels: int, size: tuple[int, int]) -> np.ndarray:
    """A Pillow image as uint8 ``(channels, *size)``: converted (16-bit grey scaled to 8 bits), and resized
    (antialiased when shrinking)."""
    image = _eight_bit(image).convert("RGB" if channels == 3 else "L")
    if image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    array = np.asarray(image)
    return (array[None] if array.ndim == 2 else array.transpose(2, 0, 1)).copy()  # contiguous, writable


def _named(source: Path | IO[bytes]) -> str:
    return str(source) if isinstance(source, Path) else getattr(source, "name", "the image")


def decoded(path: Path | IO[bytes], channels: int, size: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int]]:
    """One image file (or its bytes, named by ``.name``) as uint8 ``(channels, *size)``, and its own width and height
    before any resize; one that does not decode raises ``DataError`` naming it.

    Pillow decodes (torchvision's own image decoding is deprecated since 0.29).
    """
    try:
        with Image.open(path) as image:
            image.load()  # the whole file: a truncated one fails here
            return pixel_array(image, channels, size), image.size
    except Image.DecompressionBombError as err:  # a header claiming billions of pixels: never decoded
        raise DataError(f"{_named(path)}: refused, {str(err).splitlines()[0]}") from None
    except Image.UnidentifiedImageError:
        raise DataError(f"{_named(path)}: not an image file (in none of the formats Pillow reads)") from None
    except (OSError, SyntaxError, ValueError) as err:  # truncated, corrupt or not an image at all
        reason = first_line(err)
        raise DataError(f"{_named(path)}: unreadable or truncated image ({reason})") from None


def palette(classes: int) -> list[int]:
    """A colour a class (0 black, the others hues apart), as Pillow's flat RGB palette."""
    hues = [colorsys.hsv_to_rgb(i / max(classes - 1, 1), 0.75, 1.0) for i in range(classes - 1)]
    return [0, 0, 0, *(round(255 * c) for rgb in hues for c in rgb)]


def class_maps(array: Path, classes: int) -> int:
    """Each sample's class map as a PNG beside ``array`` (``<array>/<row>.png``: a pixel's value is its class, its
    colour from :func:`palette`), from logits ``(N, classes, H, W)`` (their argmax) or class indices ``(N, H, W)``;
    how many were written (none for another output, or over 256 classes)."""
    values = np.load(array, mmap_mode="r")
    logits = values.ndim == 4 and values.shape[1] == classes
    if not (logits or (values.ndim == 3 and values.dtype.kind in "iu")) or classes > 256:
        return 0
    folder = array.with_suffix("")
    shutil.rmtree(folder, ignore_errors=True)  # an earlier prediction's maps never mix with these
    folder.mkdir()
    colours = palette(classes)
    for row, values_of in enumerate(values):
        image = Image.fromarray((values_of.argmax(0) if logits else values_of).astype(np.uint8), "P")
        image.putpalette(colours)
        image.save(folder / f"{row}.png")
    return len(values)
