"""Write tiny datasets in the real on-disk formats torchvision reads (no download)."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

MNIST_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def write_idx(path: Path, array: np.ndarray) -> None:
    """The idx format of MNIST: magic (0, 0, type 0x08 = uint8, ndim), big-endian sizes, raw bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(folder: Path, n_train: int, n_test: int, seed: int) -> dict[bool, tuple[np.ndarray, np.ndarray]]:
    """Random 28x28 uint8 images with labels 0-9; returns ``{train: (images, labels)}``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written = {}
    for train, n in ((True, n_train), (False, n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = np.arange(n, dtype=np.uint8) % 10
        images_name, labels_name = MNIST_FILES[train]
        write_idx(folder / images_name, images)
        write_idx(folder / labels_name, labels)
        written[train] = (images, labels)
    return written


def write_cifar10(folder: Path, n_per_batch: int, seed: int) -> None:
    """Five training batches, a test batch and the meta file, pickled as in the official release.

    The release was pickled by Python 2, whose ``str`` keys torchvision reads back as ``str``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 256, size=(n_per_batch, 3 * 32 * 32), dtype=np.uint8),
            "labels": [i % 10 for i in range(n_per_batch)],
        }
        with (folder / name).open("wb") as f:
            pickle.dump(batch, f)
    meta = {"label_names": [f"class{i}" for i in range(10)]}
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump(meta, f)


def write_image_folder(root: Path, classes: int, per_class: int, size: int = 8) -> list[Path]:
    """The bundled digits as grey PNG files in ``root/<digit name>/<n>.png`` (real images a net can learn)."""
    from PIL import Image

    from research.data.digits import load_digits

    images, labels = load_digits()
    names = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    written = []
    for c in range(classes):
        folder = root / names[c]
        folder.mkdir(parents=True, exist_ok=True)
        for n, i in enumerate((labels == c).nonzero().flatten()[:per_class].tolist()):
            pixels = (images[i].numpy() * 255 / 16).round().astype(np.uint8)
            Image.fromarray(pixels, mode="L").resize((size, size)).save(folder / f"{n:03d}.png")
            written.append(folder / f"{n:03d}.png")
    return written


def truncate(path: Path) -> None:
    """Cut a file in half, as an interrupted copy leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def write_png16(path: Path, values: np.ndarray) -> Path:
    """A 16-bit grey PNG (Pillow mode I;16) of ``values`` (0-65535)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(values.astype(np.uint16)).save(path)
    return path


def write_bomb_png(path: Path, side: int = 100_000) -> Path:
    """A PNG whose header claims ``side`` x ``side`` pixels (a decompression bomb), with almost no data."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))  # fmt: skip
    return path
