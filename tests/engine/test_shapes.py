"""Shapes are declared once, by the data: linked into the model and network, contradictions refused."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import forkserver
import numpy as np
import pytest
import torch
import yaml
from helpers import CONFIGS, LIMIT
from test_surface import PUBLIC, engine_imports

import research.data
from kiln.cli import build_cli
from kiln.cli.config_errors import skeleton
from kiln.cli.links import link_targets
from kiln.data import SyntheticDataModule
from kiln.errors import ConfigError, UsageError
from research.data import DigitsDataModule

SYNTHETIC = ["--data", "kiln.data.SyntheticDataModule", "--data.num_samples", "64", "--data.channels", "2",
             "--data.size", "6", "--data.num_classes", "3", "--data.num_workers", "0",
             "--trainer.logger", "false"]  # fmt: skip


def written_keys(value: object, path: str = "") -> set[tuple[str, ...]]:
    if isinstance(value, dict):
        return {k for key, child in value.items() for k in written_keys(child, f"{path}.{key}" if path else key)}
    if isinstance(value, list):
        return {k for child in value for k in written_keys(child, path)}
    return {skeleton(path)}


@pytest.mark.parametrize("config", sorted(CONFIGS.rglob("*.yaml")), ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_no_config_restates_what_the_data_declares(config: Path) -> None:
    restated = written_keys(yaml.safe_load(config.read_text()) or {}) & {skeleton(t) for t in link_targets()}
    assert not restated, f"{config.name} states {restated}: the data declares it"


def test_the_datas_shapes_reach_the_model_and_the_network() -> None:
    cli = build_cli([*LIMIT, *SYNTHETIC], run=False)
    assert cli.model.num_classes == 3 and cli.model.net.in_channels == 2
    assert cli.model.net.head[-1].out_features == 3
    assert cli.model.hparams["net"]["init_args"]["num_classes"] == 3
    assert "input_shape" not in cli.model.hparams["net"]["init_args"]  # SmallCNN does not take it
    mlp = build_cli([*LIMIT, *SYNTHETIC, "--model.init_args.net", "research.nets.MLP"], run=False)
    assert mlp.model.net.layers[1].in_features == 2 * 6 * 6  # sized from the data's (2, 6, 6)
    assert mlp.model.hparams["net"]["init_args"]["input_shape"] == (2, 6, 6)
    assert "in_channels" not in mlp.model.hparams["net"]["init_args"]  # MLP does not take it


def test_a_value_that_agrees_with_the_data_is_accepted(tmp_path: Path) -> None:
    same = tmp_path / "same.yaml"
    same.write_text("model:\n  init_args:\n    net:\n      init_args: {in_channels: 1, num_classes: 10}\n")
    cli = build_cli([*LIMIT, "-c", str(same), "--model.init_args.num_classes", "10"], run=False)
    assert cli.model.num_classes == 10


def test_a_value_that_contradicts_the_data_names_both_in_one_line(tmp_path: Path) -> None:
    three = tmp_path / "three.yaml"
    three.write_text("model:\n  init_args:\n    net:\n      init_args:\n        in_channels: 3\n")
    with pytest.raises(UsageError) as err:
        build_cli([*LIMIT, "-c", str(three)], run=False)
    assert str(err.value) == (
        f"{three}: model.init_args.net.init_args.in_channels: 3 contradicts the data: DigitsDataModule has "
        "in_channels 1. Drop the setting: the data sets it"
    )


@pytest.mark.slow
def test_the_real_command_refuses_a_contradicting_value_with_exit_2_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "cli").mkdir()
    done = forkserver.run(
        [sys.executable, "-m", "kiln", "fit", *LIMIT, "--model.init_args.num_classes", "5"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "cli",
    )
    assert done.returncode == 2
    assert "error: --model.init_args.num_classes: 5 contradicts the data: DigitsDataModule has num_classes 10" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not any((tmp_path / "cli" / "runs" / "digits").glob("*"))  # nothing left behind


def test_samples_without_a_channel_dimension_for_a_channel_network_is_one_line() -> None:
    args = ["-c", str(CONFIGS / "experiment" / "waveforms.yaml"), "--data.init_args.channel", "false"]
    with pytest.raises(ConfigError, match=r"shape \(64,\), with no channel dimension, but the network takes in_ch"):
        build_cli([*LIMIT, *args, "--trainer.logger", "false"], run=False)


@pytest.mark.slow
def test_a_run_on_other_shapes_resumes_and_its_checkpoint_rebuilds_the_model() -> None:
    mlp = [*SYNTHETIC, "--model.init_args.net", "research.nets.MLP", "--run.test_after_fit", "false"]
    build_cli(["fit", *LIMIT, *mlp, "--trainer.max_epochs", "1"])
    resumed = build_cli(["fit", *LIMIT, *mlp, "--ckpt_path", "last"])  # not refused as a change of num_classes
    assert resumed.trainer.current_epoch == 2
    ckpt = Path(resumed.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    tested = build_cli(["test", *LIMIT, *SYNTHETIC, "--ckpt_path", str(ckpt)])  # rebuilt from its hparams: an MLP
    assert type(tested.model.net).__name__ == "MLP" and "test/acc" in tested.trainer.callback_metrics


class Reseeding(DigitsDataModule):
    """Digits loaded by code that reseeds every global RNG, as many dataset generators do."""

    def load(self) -> None:
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        super().load()


def test_a_dataset_that_reseeds_the_global_rngs_leaves_the_runs_seeding_alone() -> None:
    torch.manual_seed(42)
    random.seed(42)
    np.random.seed(42)
    before = torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()  # type: ignore[index]
    Reseeding(num_workers=0).setup()
    assert torch.equal(torch.random.get_rng_state(), before[0])
    assert random.getstate() == before[1] and np.array_equal(np.random.get_state()[1], before[2])  # type: ignore[index]


def test_normalisation_statistics_fit_any_sample_shape() -> None:
    for shape, mean in [((40,), (0.5,)), ((40,), tuple(range(40))), ((2, 40), (0.1, 0.2)), ((3, 4, 4), (0.5,) * 3)]:
        dm = SyntheticDataModule(num_samples=8, num_workers=0, mean=mean, std=(1.0,))
        dm.input_shape = shape
        data = dm.make_dataset(torch.zeros(8, *shape), torch.zeros(8, dtype=torch.long), train=False)
        x, _ = data[0]
        assert x.shape == shape
        expected = -torch.tensor(mean, dtype=torch.float32).view(-1, *[1] * (len(shape) - 1))
        assert torch.allclose(x, expected.expand(shape))
    dm = SyntheticDataModule(num_samples=8, num_workers=0, mean=(0.1, 0.2, 0.3))
    dm.input_shape = (40,)
    with pytest.raises(ConfigError, match=r"data.mean: 3 values, but samples have shape \(40,\): give 1 value, or"):
        dm.make_dataset(torch.zeros(8, 40), torch.zeros(8, dtype=torch.long), train=False)


def readme_example() -> tuple[str, str]:
    """The Python file and the YAML of the README's "A dataset" example."""
    readme = (CONFIGS.parent / "README.md").read_text()
    section = readme[readme.index("**A dataset**") : readme.index("### A network")]
    python, config = re.findall(r"```(?:python|yaml)\n(.*?)```", section, re.DOTALL)
    return python, config


def test_the_readme_dataset_example_trains_with_the_lines_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python, config = readme_example()
    assert engine_imports(python) <= PUBLIC  # it imported kiln.data.base, which the project's own test refused
    readme = (CONFIGS.parent / "README.md").read_text()
    code_lines = [line for line in python.splitlines()[1:] if line.strip()]  # after the file-name comment
    assert f"one file of {len(code_lines)} lines" in readme
    assert f"one YAML of {len(config.strip().splitlines())} lines" in readme
    package = tmp_path / "package"
    package.mkdir()
    (package / "my_signals.py").write_text(python)
    monkeypatch.setattr(research.data, "__path__", [*research.data.__path__, str(package)])  # as if in its folder
    g = torch.Generator().manual_seed(0)
    Path("data").mkdir()
    torch.save((torch.randn(60, 2, 100, generator=g), torch.arange(60) % 3), "data/my_signals.pt")
    (tmp_path / "my_signals.yaml").write_text(config)
    cli = build_cli(["fit", "-c", str(tmp_path / "my_signals.yaml"), *LIMIT, "--trainer.logger", "false"])
    assert cli.trainer.state.finished and cli.model.net.in_channels == 2 and cli.model.num_classes == 3
    assert Path(cli.trainer.default_root_dir).parent.name == "my_signals"


POSES = """
import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch.utils.data import DataLoader, TensorDataset


class Poses(LightningDataModule):
    num_joints = 5  # a declaration kiln has no name of its own for

    def setup(self, stage):
        self.set = TensorDataset(torch.randn(16, 6), torch.randn(16, 10))

    def train_dataloader(self):
        return DataLoader(self.set, batch_size=8)


class PoseNet(LightningModule):
    def __init__(self, num_joints: int):
        super().__init__()
        self.num_joints, self.layer = num_joints, torch.nn.Linear(6, 2 * num_joints)
"""


def test_a_declaration_the_project_names_links_into_the_model_with_no_engine_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pose task's `num_joints` needed an edit of the engine's fixed list of declarations (cli/links.py)."""
    (tmp_path / "poses.py").write_text(POSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--model", "poses.PoseNet", "--data", "poses.Poses", "--trainer.logger", "false"]
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "poses"\n\n[tool.kiln]\ndeclares = ["num_joints"]\n')
    assert build_cli(args, run=False).model.num_joints == 5
    with pytest.raises(UsageError) as err:
        build_cli([*args, "--model.init_args.num_joints", "4"], run=False)
    assert "4 contradicts the data: Poses has num_joints 5. Drop the setting" in str(err.value)
    (tmp_path / "pyproject.toml").write_text('[tool.kiln]\ndeclares = "num_joints"\n')
    with pytest.raises(ConfigError) as bad:
        build_cli(args, run=False)
    assert (
        str(bad.value) == "pyproject.toml: [tool.kiln] declares = 'num_joints': give a list of argument names, "
        'e.g. ["num_joints"]'
    )
