"""Pictures a person can read: every class name whole, every count written, the sweep's metric and parameter
names on Optuna's plots; checked on the figure's own text objects (what the PNG shows), not on pixel sizes."""

from __future__ import annotations

import io
import os
import sys
import warnings
from pathlib import Path

import forkserver
import numpy as np
import optuna
import pytest
import torch
from helpers import LIMIT, PROBES
from PIL import Image

from kiln.commands.sweep.report import sweep_figures, write_pictures
from kiln.commands.sweep.space import Param, Sweep
from kiln.runs import figures

LONG = ["airplane", "automobile", "a class name longer than any column", "cat"]


def test_the_confusion_matrix_shows_every_count_share_and_whole_class_name() -> None:
    counts = torch.tensor([[50, 1, 0, 3], [2, 40, 5, 0], [0, 7, 33, 1], [4, 0, 0, 60]])
    figure = figures.confusion_figure(counts, LONG, "test: weights best-epoch=3")
    shown = figures.texts(figure)
    assert all(shown.count(name) == 4 for name in LONG)  # under and beside both panels, never cut
    assert all(str(int(c)) in shown for c in counts.flatten())  # the counts, zeros too
    assert "0.93" in shown and "0.85" in shown  # 50 / 54 and 40 / 47, the shares of their true class
    assert "test: weights best-epoch=3" in shown


def test_a_hundred_classes_get_a_bigger_picture_with_text_of_the_same_size() -> None:
    small = figures.confusion_figure(torch.eye(10, dtype=torch.long) * 7, [str(i) for i in range(10)])
    names = [f"class_{i}" for i in range(100)]
    big = figures.confusion_figure(torch.eye(100, dtype=torch.long) * 7 + torch.diag(torch.ones(99), 1).long(), names)
    shown = figures.texts(big)
    assert all(name in shown for name in names)
    assert shown.count("7") == 100 and shown.count("1") == 99  # every non-zero count; a blank cell is 0
    assert big.get_size_inches()[0] > 8 * small.get_size_inches()[0]


def test_batch_grid_captions_are_whole_labels_wrapped_to_the_cell(tmp_path: Path) -> None:
    labels = [LONG[i % 4] for i in range(12)]
    figure = figures.image_grid(torch.rand(12, 3, 8, 8), labels, columns=4, cell=0.8)
    assert [t for t in figures.texts(figure) if t in LONG] == labels
    assert figures.save(figure, tmp_path / "grid.png") == (tmp_path / "grid.png").read_bytes()
    assert Image.open(tmp_path / "grid.png").size == (4 * 80, 3 * (80 + 42))  # 0.8 in cells + 3 caption lines
    for channels in (1, 2, 4):  # any channel count draws (two: the first, grey)
        assert figures.png(figures.image_grid(torch.rand(3, channels, 8, 8), ["a", "b", "c"]))
    signals = figures.signal_grid(torch.randn(3, 2, 20), ["up", "down", "flat"], columns=8)
    assert [t for t in figures.texts(signals) if t in ("up", "down", "flat")] == ["up", "down", "flat"]


def test_every_figure_shows_in_a_notebook_as_a_picture_with_content() -> None:
    """IPython shows nothing of a figure without axes: the quickstart's batch grid, predictions and mistakes cells
    printed `<Figure size 880x256 with 0 Axes>`, and the notebook still passed."""
    from IPython.core.pylabtools import print_figure

    drawn = {
        "image grid": figures.image_grid(torch.rand(4, 1, 8, 8), list("abcd")),
        "signal grid": figures.signal_grid(torch.randn(3, 2, 20), ["up", "down", "flat"]),
        "confusion matrix": figures.confusion_figure(torch.eye(3, dtype=torch.long) * 5, ["a", "b", "c"]),
    }
    for name, figure in drawn.items():
        png = print_figure(figure)  # what a notebook cell's output holds
        assert png, f"{name}: nothing shown"
        grey = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float32)
        assert grey.std() > 10, f"{name}: a blank picture"


def test_sweep_pictures_are_optunas_with_the_metric_and_full_parameter_names(tmp_path: Path) -> None:
    lr, width = "model.init_args.optimizer.init_args.lr", "model.init_args.net.init_args.width"
    space = [Param(lr, "float", 1e-4, 1e-1, log=True), Param(width, "categorical", choices=[8, 16])]
    sweep = Sweep(name="tiny", metric="val/acc", direction="maximize", space=space)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float(lr, 1e-4, 1e-1, log=True) * t.suggest_categorical(width, [8, 16]), 6)
    drawn = sweep_figures(study, sweep)
    assert set(drawn) == {"history", "importance"}
    for figure in drawn.values():
        shown = " ".join(figures.texts(figure))
        assert "sweep tiny, val/acc (maximize)" in shown and "val/acc" in shown
        (axes,) = figure.axes  # one title (Optuna's left one and kiln's centred one were drawn over each other)
        assert not any(axes.get_title(loc=loc) for loc in ("left", "center", "right"))
        renderer, edge = figure.canvas.get_renderer(), figure.bbox.width
        for text in [figure.get_suptitle() and figure._suptitle, *axes.get_yticklabels()]:  # inside the picture: the
            extent = text.get_window_extent(renderer)  # parameters' full keys were cut at its left edge
            assert extent.x0 >= 0 and extent.x1 <= edge, text.get_text()
    assert lr in figures.texts(drawn["importance"]) and width in figures.texts(drawn["importance"])
    written = write_pictures(study, sweep, tmp_path)
    assert [p.name for p in written] == ["history.png", "importance.png"]
    assert all(Image.open(p).size == (900, 450) for p in written)
    tied = optuna.create_study(direction="maximize")  # equal values: Optuna drew every importance 0 (and warned)
    tied.optimize(lambda t: 0 * t.suggest_float(lr, 1e-4, 1e-1, log=True) + t.suggest_categorical(width, [8]), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        assert set(sweep_figures(tied, sweep)) == {"history"}


@pytest.mark.slow
def test_a_run_stopped_inside_its_first_epoch_still_draws_its_batch_grid(tmp_path: Path) -> None:
    """The grid is drawn as the first epoch ends, off the way to the first step, or as a run stopped before ends."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    command = [sys.executable, "-m", "kiln", "fit", *LIMIT, "--trainer.logger", "false", "--run.root", str(tmp_path),
               "--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=2",
               "--trainer.callbacks.name=SIGTERM", f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip
    done = forkserver.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 143, done.stderr[-2000:]
    (grid,) = tmp_path.glob("*/*/batch_grid.png")
    assert Image.open(grid).width == 8 * 96  # the first batch's 32 images, 8 a row
