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
from torch import Tensor

from kiln.files import written_whole

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100  # pixels per inch of a saved picture
LINE = 0.12  # inches of one line of 7-point text
CHANNEL_COLOURS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange")


def _captions(labels: Sequence[str], cell: float) -> tuple[list[str], int]:
    """The whole labels, each of their lines wrapped to the width of a panel (a 7-point character is about
    1/17 inch wide), and the most lines one takes."""
    width = max(4, int(cell * 17))
    captions = ["\n".join(textwrap.fill(line, width=width) for line in label.split("\n")) for label in labels]
    return captions, max((c.count("\n") + 1 for c in captions), default=1)


def image_grid(images: Tensor, labels: Sequence[str], columns: int = 8, cell: float = 1.1) -> Figure:
    """Images in [0, 1] (N x C x H x W) tiled into one picture (one axes of the figure's size, pixel for pixel: a
    grid of axes cost more than the drawing), each under its full label; ``cell`` inches a tile. Three channels or more:
    the first three as RGB; one or two: the first, grey."""
    import torch.nn.functional as F
    from matplotlib.figure import Figure

    captions, lines = _captions(labels, cell)
    n = len(images)
    columns = max(1, min(columns, n))
    rows = math.ceil(n / columns)
    size = round(cell * DPI)  # pixels a tile
    title = round((LINE * lines + 0.06) * DPI)
    tiles = F.interpolate(images.detach().float().cpu().clamp(0, 1), size=(size - 4, size - 4), mode="nearest")
    tiles = tiles[:, :3] if tiles.shape[1] >= 3 else tiles[:, :1].expand(-1, 3, -1, -1)  # 1 or 2: the first, grey
    height, width = rows * (size + title), columns * size
    canvas = np.ones((height, width, 3), dtype=np.float32)
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    for i, (tile, caption) in enumerate(zip(tiles, captions, strict=True)):
        x, y = (i % columns) * size, (i // columns) * (size + title)  # pixels from the top left
        canvas[y + title + 2 : y + title + size - 2, x + 2 : x + size - 2] = tile.permute(1, 2, 0).numpy()
        figure.text((x + size / 2) / width, 1 - (y + title - 2) / height, caption, ha="center", va="bottom", fontsize=7)
    axes = figure.add_axes((0, 0, 1, 1))  # IPython shows no figure without axes: figimage alone drew nothing there
    axes.imshow(canvas, interpolation="nearest", aspect="auto")
    axes.set_axis_off()
    return figure


def signal_grid(signals: Tensor, labels: Sequence[str], columns: int = 8, cell: float = 1.5) -> Figure:
    """1-D samples (N x C x L) as small line plots on one axes (a grid of axes, each with its ticks, took 1.3 s to
    draw), a colour per channel (five at most), each under its label, with its highest and lowest value at its left
    and a grey line at zero where zero is in range."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    captions, lines = _captions(labels, cell)
    values = signals.detach().float().cpu()[:, : len(CHANNEL_COLOURS)].numpy()
    columns = max(1, min(columns, len(values)))
    rows = math.ceil(len(values) / columns)
    title, left = LINE * lines + 0.06, 0.3  # inches above a plot for its caption, and left of it for its range
    figure = Figure(figsize=(columns * cell, rows * (cell + title)))
    ax = figure.add_axes((0, 0, 1, 1), xlim=(0, columns * cell), ylim=(rows * (cell + title), 0))  # inches, down
    ax.set_axis_off()
    traces: list[list[np.ndarray]] = [[] for _ in CHANNEL_COLOURS]
    frames, zeros = [], []
    for i, (sample, caption) in enumerate(zip(values, captions, strict=True)):
        x0, top = (i % columns) * cell + left, (i // columns) * (cell + title) + title + 0.04
        width, height = cell - left - 0.06, cell - 0.12
        low, high = float(sample.min()), float(sample.max())
        xs = x0 + np.linspace(0.0, width, sample.shape[-1])
        for channel, trace in enumerate(sample):
            traces[channel].append(np.column_stack([xs, _down(trace, low, high, top, height)]))
        frames.append([(x0, top), (x0 + width, top), (x0 + width, top + height), (x0, top + height), (x0, top)])
        if low <= 0.0 <= high:
            level = float(_down(np.zeros(1), low, high, top, height)[0])
            zeros.append([(x0, level), (x0 + width, level)])
        ax.text(x0 + width / 2, top - 0.03, caption, ha="center", va="bottom", fontsize=7)
        ax.text(x0 - 0.03, top, f"{high:.3g}", ha="right", va="top", fontsize=5)
        ax.text(x0 - 0.03, top + height, f"{low:.3g}", ha="right", va="bottom", fontsize=5)
    ax.add_collection(LineCollection(frames, colors="lightgrey", linewidths=0.5))
    ax.add_collection(LineCollection(zeros, colors="lightgrey", linewidths=0.6))
    for colour, segments in zip(CHANNEL_COLOURS, traces, strict=True):
        ax.add_collection(LineCollection(segments, colors=colour, linewidths=0.8))
    return figure


def _down(values: np.ndarray, low: float, high: float, top: float, height: float) -> np.ndarray:
    """Where values between ``low`` and ``high`` lie, in inches down a plot ``height`` tall starting at ``top``."""
    return top + height * (np.full_like(values, 0.5) if high == low else (high - values) / (high - low))


def _confusion_layout(k: int, longest: int) -> tuple[int, float, float, float, float, float, float]:
    """Font size and inches (names beside a panel, under it, the panel, its left edge, the figure's width and
    height) for ``k`` classes whose longest name has ``longest`` characters."""
    font = 8 if k <= 20 else 6
    names = 0.1 + (font + 1) / 72 * 0.6 * min(longest, 60)  # inches the longest name takes beside a panel
    below = 0.1 + (names * 0.72 if longest > 2 else (font + 1) / 72)  # under it, turned 45 degrees
    panel, left, top = max(2.5, 0.42 * k), names + 0.35, 0.55  # 0.35: the axis label; 0.55: the titles
    return font, names, below, panel, left, 2 * (left + panel) + 0.2, top + panel + below + 0.35


def confusion_figure(matrix: Tensor, class_names: Sequence[str], title: str = "") -> Figure:
    """Counts beside the share of each true class, every count written in its cell (above 20 classes a blank
    cell is 0; above 30 the share is the colour alone) and every class name in full; the figure grows with the
    number of classes so that text keeps its size. Names and numbers are the figure's own text, placed in inches:
    matplotlib's ticks and axis labels took a third of the drawing."""
    from matplotlib.figure import Figure

    counts = matrix.detach().cpu().long().numpy()
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    k, longest = len(counts), max((len(name) for name in class_names), default=1)
    font, names, below, panel, left, width, height = _confusion_layout(k, longest)
    figure = Figure(figsize=(width, height))  # a fixed layout: matplotlib's constrained one costs more

    def write(x: float, y: float, text: str, **style: object) -> None:  # at inches from the bottom left
        figure.text(x / width, y / height, text, **style)  # type: ignore[arg-type]

    cell, y0 = panel / k, below + 0.35
    for x0, values, name in zip((left, 2 * left + panel), (counts, shares), ("counts", "share of the true class"),
                                strict=True):  # fmt: skip
        ax = figure.add_axes((x0 / width, y0 / height, panel / width, panel / height), xticks=[], yticks=[])
        ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
        centre = [(x0 + (i + 0.5) * cell, y0 + panel - (i + 0.5) * cell) for i in range(k)]  # column x, row y
        for i, j in np.argwhere(values > 0) if k > 20 else np.ndindex(k, k):  # many classes: an empty cell is 0
            if values is shares and k > 30:
                break  # the counts carry the numbers; the colour is the share
            text = f"{values[i, j]:d}" if values is counts else f"{values[i, j]:.2f}"
            write(centre[j][0], centre[i][1], text, ha="center", va="center", fontsize=font,
                  color="white" if shares[i, j] > 0.5 else "black")  # fmt: skip
        for (x, y), class_name in zip(centre, class_names, strict=True):
            write(x, y0 - 0.05, class_name, fontsize=font + 1, va="top", rotation_mode="anchor",
                  **({"rotation": 45, "ha": "right"} if longest > 2 else {"ha": "center"}))  # fmt: skip
            write(x0 - 0.05, y, class_name, fontsize=font + 1, ha="right", va="center")
        write(x0 + panel / 2, 0.08, "predicted class", ha="center", va="bottom")
        write(x0 - names - 0.1, y0 + panel / 2, "true class", rotation=90, ha="right", va="center")
        write(x0 + panel / 2, y0 + panel + 0.06, name, fontsize=10, ha="center", va="bottom")
    if title:
        figure.suptitle(title, fontsize=10, y=1 - 0.08 / height, va="top")
    return figure


def texts(figure: Figure) -> list[str]:
    """Every piece of text the figure draws (titles, tick labels, annotations), a wrapped one joined back up."""
    from matplotlib.text import Text

    return [" ".join(t.get_text().split("\n")) for t in figure.findobj(Text) if t.get_visible() and t.get_text()]


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes, at ``DPI`` (the batch grid's pixels are placed for it, one for one)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})  # fast: written once a run
    return buffer.getvalue()


def save(figure: Figure, path: Path) -> bytes:
    """Write the figure as a PNG whole or not at all (a full disk leaves no 0-byte file); returns its bytes."""
    data = png(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as partial:
        partial.write_bytes(data)
    return data
