"""Inputs that are not images: (B, C, L) signals and (B, L) sequences through every default callback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import CONFIGS, LIMIT
from PIL import Image

from kiln.cli import build_cli
from kiln.data import BatchRandomAffine
from kiln.errors import ConfigError

WAVEFORMS = ["-c", str(CONFIGS / "experiment" / "waveforms.yaml")]
STATED_ACCURACY = 0.95  # README, "Inputs that are not images"


@pytest.mark.slow
def test_the_waveforms_example_reaches_its_stated_accuracy_with_every_default_callback() -> None:
    cli = build_cli(["fit", *WAVEFORMS, "-c", str(CONFIGS / "logger" / "csv.yaml")])  # a logger: LR monitor on
    listed = {type(c).__name__ for c in cli.trainer.callbacks}  # type: ignore[attr-defined]
    defaults = {"BatchSanityCheck", "GradNormMonitor", "BatchGrid", "ConfusionMatrixReport", "LearningRateMonitor"}
    assert defaults <= listed
    run_dir = Path(cli.trainer.default_root_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert all(test["metrics"]["test/acc"] >= STATED_ACCURACY for test in metrics["test"])
    assert (run_dir / "batch_grid.png").is_file() and list(run_dir.glob("confusion_matrix-*.png"))


@pytest.mark.parametrize(
    ("extra", "shape"),
    [
        ([], (1, 64)),
        pytest.param(
            ["--data.init_args.channel", "false", "--model.init_args.net", "research.nets.MLP"],
            (64,),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["signals", "sequences"],
)
def test_one_dimensional_samples_train_and_are_drawn_as_line_plots(extra: list[str], shape: tuple[int, ...]) -> None:
    cli = build_cli(["fit", *WAVEFORMS, *LIMIT, "--trainer.logger", "false", *extra])
    assert cli.datamodule.input_shape == shape and cli.trainer.state.finished
    grid = Image.open(Path(cli.trainer.default_root_dir) / "batch_grid.png")
    assert grid.width == 8 * 144  # line-plot cells (144 px), not 96 px image tiles
    assert "test/acc" in (cli.test_metrics or {})


def test_signals_on_the_device_path_keep_their_shape_and_values() -> None:
    loader = build_cli([*WAVEFORMS, "--trainer.logger", "false"], run=False)
    device = build_cli([*WAVEFORMS, "--trainer.logger", "false", "--data.init_args.on_device", "true"], run=False)
    for cli in (loader, device):
        cli.datamodule.setup("fit")
        cli.datamodule.trainer = cli.trainer
    x_loader, y_loader = next(iter(loader.datamodule.val_dataloader()))
    x_device, y_device = next(iter(device.datamodule.val_dataloader()))
    assert x_device.shape == (64, 1, 64)  # was (1, 64, 1, 64): statistics shaped for images
    assert x_device.device == device.trainer.strategy.root_device  # a GPU where there is one
    assert torch.equal(x_loader, x_device.cpu()) and torch.equal(y_loader, y_device.cpu())


@pytest.mark.slow
def test_image_only_settings_on_signals_say_so_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"BatchRandomAffine moves images .* got a batch of shape \(4, 1, 64\)"):
        BatchRandomAffine(degrees=10)(torch.zeros(4, 1, 64))
    cli = build_cli(["fit", *WAVEFORMS, *LIMIT, "--trainer.logger", "false", "--trainer.callbacks+",
                     "kiln.callbacks.ChannelsLast"])  # fmt: skip
    assert cli.trainer.state.finished
    assert all(p.is_contiguous() for p in cli.model.parameters())  # left as they were: (C, L) signals
    log = (Path(cli.trainer.default_root_dir) / "console.log").read_text()
    assert log.count("ChannelsLast: off, as samples of shape (1, 64) are not images (C, H, W)") == 1
