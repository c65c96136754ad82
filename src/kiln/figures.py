"""Pictures a person reads: matplotlib's object API (a ``Figure`` without pyplot: no GUI, no global state, safe
in a notebook and in a callback), imported only when a picture is drawn."""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from torch import Tensor

from kiln.files import written_whole

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100  # pixels per inch of a saved picture
CHANNEL_COLOURS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange")


def _grid(n: int, columns: int, cell: float) -> tuple[Figure, list[Axes]]:
    """A figure of ``n`` small panels, ``columns`` wide, each ``cell`` inches with room for a title."""
    from matplotlib.figure import Figure

    columns = max(1, min(columns, n))
    rows = math.ceil(n / columns)
    figure = Figure(figsize=(columns * cell, rows * (cell + 0.3)), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel().tolist()
    for extra in axes[n:]:
        extra.set_visible(False)
    return figure, axes[:n]


def _caption(label: str, cell: float) -> str:
    """The whole label, each of its lines wrapped to the width of its panel (a 7-point character is about
    1/17 inch wide)."""
    return "\n".join(textwrap.fill(line, width=max(4, int(cell * 17))) for line in label.split("\n"))


def image_grid(images: Tensor, labels: Sequence[str], columns: int = 8, cell: float = 1.1) -> Figure:
    """Images in [0, 1] (N x C x H x W), each titled with its full label."""
    figure, axes = _grid(len(images), columns, cell)
    for ax, image, label in zip(axes, images, labels, strict=True):
        pixels = image.detach().float().clamp(0, 1).cpu()
        if pixels.shape[0] == 1:
            ax.imshow(pixels[0].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        else:
            ax.imshow(pixels[:3].permute(1, 2, 0).numpy(), interpolation="nearest")
        ax.set_title(_caption(label, cell), fontsize=7)
        ax.set_axis_off()
    return figure


def signal_grid(signals: Tensor, labels: Sequence[str], columns: int = 8, cell: float = 1.5) -> Figure:
    """1-D samples (N x C x L) as small line plots, a colour per channel (five at most), each titled with its label."""
    figure, axes = _grid(len(signals), columns, cell)
    for ax, signal, label in zip(axes, signals.detach().float().cpu(), labels, strict=True):
        for channel, values in enumerate(signal[: len(CHANNEL_COLOURS)]):
            ax.plot(values.numpy(), color=CHANNEL_COLOURS[channel], linewidth=0.8)
        ax.axhline(0.0, color="lightgrey", linewidth=0.6, zorder=0)
        ax.set_title(_caption(label, cell), fontsize=7)
        ax.tick_params(labelsize=5)
    return figure


def confusion_figure(matrix: Tensor, class_names: Sequence[str], title: str = "") -> Figure:
    """Counts beside the share of each true class, every count written in its cell (above 20 classes a blank
    cell is 0; above 30 the share is the colour alone) and every class name in full; the figure grows with the
    number of classes so that text keeps its size."""
    from matplotlib.figure import Figure

    counts = matrix.detach().cpu().long().numpy()
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    k = len(counts)
    longest = max((len(name) for name in class_names), default=1)
    label_room = 0.3 + 0.075 * min(longest, 40)  # inches for the names under and beside the panel
    panel = max(2.5, 0.42 * k)
    figure = Figure(figsize=(2 * (panel + label_room) + 0.6, panel + label_room + 0.6), layout="constrained")
    font = 8 if k <= 20 else 6
    panels = zip(figure.subplots(1, 2), (counts, shares), ("counts", "share of the true class"), strict=True)
    for ax, values, name in panels:
        ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
        for i, j in np.argwhere(values > 0) if k > 20 else np.ndindex(k, k):  # many classes: an empty cell is 0
            if values is shares and k > 30:
                break  # the counts carry the numbers; the colour is the share
            text = f"{values[i, j]:d}" if values is counts else f"{values[i, j]:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=font,
                    color="white" if shares[i, j] > 0.5 else "black")  # fmt: skip
        ax.set_xticks(range(k), labels=list(class_names), fontsize=font + 1, rotation=45 if longest > 2 else 0,
                      ha="right" if longest > 2 else "center", rotation_mode="anchor")  # fmt: skip
        ax.set_yticks(range(k), labels=list(class_names), fontsize=font + 1)
        ax.set_xlabel("predicted class")
        ax.set_ylabel("true class")
        ax.set_title(name, fontsize=10)
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def texts(figure: Figure) -> list[str]:
    """Every piece of text the figure draws (titles, tick labels, annotations), a wrapped one joined back up."""
    from matplotlib.text import Text

    return [" ".join(t.get_text().split("\n")) for t in figure.findobj(Text) if t.get_visible() and t.get_text()]


def to_image(figure: Figure, dpi: int = DPI) -> Image.Image:
    """The figure as a PIL image (what W&B and TensorBoard take)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def save(figure: Figure, path: Path, dpi: int = DPI) -> Image.Image:
    """Write the figure as a PNG whole or not at all (a full disk leaves no 0-byte file); returns the picture."""
    image = to_image(figure, dpi)
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as partial:
        image.save(partial, format="PNG")
    return image
