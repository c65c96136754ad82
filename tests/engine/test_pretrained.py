"""Pretrained backbones on timm: weights from a file or the local cache, the data normalised as they expect,
and fine-tuning with a frozen-then-trained backbone at a lower learning rate."""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
from functools import cache
from pathlib import Path
from typing import Any

import forkserver
import pytest
import torch
from helpers import CONFIGS, LIMIT, PROBES
from lightning.pytorch import Callback, LightningModule, Trainer
from safetensors.torch import save_file

import research.nets as nets  # nets.Timm imports timm as it is first read, in the tests that use it
from kiln.cli import build_cli
from kiln.commands.boundary import main
from kiln.errors import ConfigError

NAME = "test_efficientnet"  # timm's own test model: ImageNet statistics, 0.2 M parameters
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@cache
def cfg() -> Any:
    """timm's configuration of NAME: its classifier, first convolution and hub repository (timm is imported by the
    tests that use it, not at collection: 0.8 CPU-s of every worker)."""
    import timm

    return timm.models.get_pretrained_cfg(NAME)


def pretrained_file(tmp_path: Path, name: str = NAME) -> tuple[Path, dict[str, torch.Tensor]]:
    """A randomly initialised timm model saved as a pretrained weights file would be (1000 classes, RGB)."""
    import timm

    torch.manual_seed(7)
    weights = timm.create_model(name).state_dict()
    path = tmp_path / f"{name}.safetensors"
    save_file(weights, str(path))
    return path, weights


def timm_net(weights: Path | str, *extra: str) -> list[str]:
    net = "--model.init_args.net"
    return [f"{net}=research.nets.Timm", f"{net}.init_args.name={NAME}", f"{net}.init_args.weights={weights}", *extra]


def test_a_saved_timm_model_loads_as_pretrained_with_a_new_head_and_an_adapted_first_convolution(
    tmp_path: Path,
) -> None:
    path, saved = pretrained_file(tmp_path)
    rgb = nets.Timm(NAME, num_classes=10, in_channels=3, weights=str(path)).model.state_dict()
    classifier = cfg().classifier
    assert all(torch.equal(rgb[k], v) for k, v in saved.items() if not k.startswith(classifier))
    assert rgb[f"{classifier}.weight"].shape[0] == 10  # a new head for the data's classes
    gray = nets.Timm(NAME, num_classes=10, in_channels=1, weights=str(path)).model.state_dict()
    stem = f"{cfg().first_conv}.weight"
    assert torch.allclose(gray[stem], saved[stem].sum(dim=1, keepdim=True))  # RGB filters summed for one channel
    fresh = nets.Timm(NAME, num_classes=10, in_channels=3).model.state_dict()  # no weights: a random initialisation
    assert not torch.equal(fresh[stem], saved[stem])


def test_a_model_built_for_one_image_size_is_built_for_the_datas() -> None:
    # fixed at 224 in timm
    vit = nets.Timm("vit_tiny_patch16_224", num_classes=10, in_channels=3, input_shape=(3, 32, 32))
    assert vit(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_weights_that_do_not_fit_and_unknown_names_stop_in_one_line(tmp_path: Path) -> None:
    other, _ = pretrained_file(tmp_path, "test_resnet")
    with pytest.raises(ConfigError, match=rf"weights: {other} does not fit timm {NAME}: ") as err:
        nets.Timm(NAME, num_classes=10, weights=str(other))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"weights: no file .*missing.safetensors"):
        nets.Timm(NAME, num_classes=10, weights=str(tmp_path / "missing.safetensors"))
    with pytest.raises(ConfigError, match=r"name: timm has no model 'test_efficientnett'; did you mean test_effic"):
        nets.Timm("test_efficientnett", num_classes=10)


def test_the_data_normalises_with_the_statistics_the_pretrained_weights_expect(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path, _ = pretrained_file(tmp_path)
    cli = build_cli([*QUIET, *timm_net(path)], run=False)  # digits: one channel
    mean, std = (0.449,), (0.226,)  # the mean of ImageNet's RGB statistics, as the summed first convolution takes
    assert (cli.datamodule.mean, cli.datamodule.std) == (mean, std)
    assert (cli.datamodule.hparams["mean"], cli.datamodule.hparams["std"]) == ([0.449], [0.226])  # the checkpoint's
    assert (cli.config.data.init_args.mean, cli.config.data.init_args.std) == ([0.449], [0.226])  # config.yaml's
    assert f"data.mean [0.449], data.std [0.226]: the statistics {NAME}'s pretrained weights expect" in (
        capsys.readouterr().err
    )
    rgb = build_cli([*QUIET, "--data=kiln.data.SyntheticDataModule", "--data.size=8", *timm_net(path)], run=False)
    assert (rgb.datamodule.mean, rgb.datamodule.std) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    capsys.readouterr()
    mine = build_cli([*QUIET, *timm_net(path), "--data.mean=[0.5]", "--data.std=[0.25]"], run=False)
    assert (mine.datamodule.mean, mine.datamodule.std) == ((0.5,), (0.25,))  # what the user wrote stands ...
    assert "--data.std: keeping yours; test_efficientnet's pretrained weights expect mean [0.449]" in (
        capsys.readouterr().err
    )  # ... and is said
    plain = build_cli([*QUIET, *timm_net(path)[:2]], run=False)  # no weights: the data's own statistics
    assert plain.datamodule.mean == type(plain.datamodule).default_mean


@pytest.mark.slow
def test_a_resume_needs_no_pretrained_file_as_its_checkpoint_holds_every_weight(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path, _ = pretrained_file(tmp_path)
    command = ["fit", *LIMIT, *QUIET, *timm_net(path), "--trainer.logger=false", "--run.test_after_fit=false"]
    first = build_cli([*command, "--trainer.max_epochs=1"])
    path.unlink()  # moved, or a cache cleaned, before a requeued job resumes
    with pytest.raises(SystemExit):
        main([*command, "--ckpt_path", "last"])
    assert "a resume may give null" in capsys.readouterr().err
    resumed = build_cli([*command, "--ckpt_path", "last", "--model.init_args.net.init_args.weights=null"])
    assert resumed.trainer.current_epoch == 2 and resumed.run_dir == first.run_dir
    assert tuple(resumed.datamodule.mean) == tuple(first.datamodule.mean) != (0.3053,)  # as trained, not digits'
    assert tuple(resumed.datamodule.std) == tuple(first.datamodule.std)


class Probe(Callback):
    """Per optimizer step: the epoch, whether any backbone/head gradient reaches the optimizer, and the LRs."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, bool, bool]] = []
        self.states: list[dict[str, torch.Tensor]] = []

    def _backbone(self, module: LightningModule) -> dict[str, torch.Tensor]:
        head = {id(t) for t in module.net.head.parameters()}  # type: ignore[union-attr]
        state = module.net.state_dict(keep_vars=True)  # type: ignore[union-attr]
        return {k: v.detach().clone() for k, v in state.items() if id(v) not in head}

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.states.append(self._backbone(pl_module))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.states.append(self._backbone(pl_module))

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        backbone, head = (any(p.grad is not None for p in group["params"]) for group in optimizer.param_groups)
        self.steps.append((trainer.current_epoch, backbone, head))


@pytest.mark.slow
def test_a_frozen_backbone_gets_no_gradient_until_its_epoch_then_trains_at_the_configured_lr_ratio(
    tmp_path: Path,
) -> None:
    path, _ = pretrained_file(tmp_path)
    command = [
        *LIMIT,
        *QUIET,
        "-c",
        str(CONFIGS / "logger" / "csv.yaml"),
        *timm_net(path),
        "--model.init_args.freeze_backbone_epochs=1",
        "--model.init_args.backbone_lr_ratio=0.1",
        "--trainer.log_every_n_steps=1",
    ]
    cli = build_cli(command, run=False)
    probe = Probe()
    cli.trainer.callbacks.append(probe)  # type: ignore[attr-defined]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert [s for s in probe.steps if s[0] == 0] == [(0, False, True)] * 5  # epoch 0: the head only
    assert [s for s in probe.steps if s[0] == 1] == [(1, True, True)] * 5  # epoch 1: everything
    before, after_frozen, after = probe.states
    assert all(torch.equal(before[k], v) for k, v in after_frozen.items())  # weights and BN statistics held
    changed = [k for k, v in after.items() if not torch.equal(after_frozen[k], v)]
    assert any("running_mean" in k for k in changed) and any(k.endswith("conv_stem.weight") for k in changed)
    with (Path(cli.trainer.default_root_dir) / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("lr-AdamW/head")]
    assert len(rows) == 10
    assert all(float(r["lr-AdamW/backbone"]) == pytest.approx(0.1 * float(r["lr-AdamW/head"])) for r in rows)
    assert float(rows[-2]["lr-AdamW/head"]) > 0  # the schedule moves both groups


def test_a_network_without_a_head_cannot_be_fine_tuned_by_parts() -> None:
    mlp = ["--model.init_args.net=research.nets.MLP", "--model.init_args.backbone_lr_ratio=0.1"]
    with pytest.raises(ConfigError, match=r"model.backbone_lr_ratio: MLP has no `head` attribute"):
        build_cli([*QUIET, *mlp], run=False)


def plant_hub_cache(cache: Path) -> None:
    """The Hugging Face cache layout ``hf_hub_download`` reads offline: a ref, a snapshot, the weights file."""
    repo = cfg().hf_hub_id
    commit = "0" * 40
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    pretrained_file(folder / "snapshots" / commit)[0].rename(folder / "snapshots" / commit / "model.safetensors")


@pytest.mark.slow
def test_hub_weights_come_from_the_local_cache_and_a_checkpoint_no_longer_needs_them(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cache = tmp_path / "hub"
    plant_hub_cache(cache)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    root = ["--run.root", str(tmp_path / "runs")]
    fit = [sys.executable, "-m", "kiln", "fit", *LIMIT, *QUIET, *root, *timm_net("hub"), "--trainer.max_epochs=1"]
    done = forkserver.run([*fit, "--run.test_after_fit=false"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"pretrained weights from the Hugging Face cache (timm/{NAME}.r160_in1k)" in done.stderr
    (best,) = (tmp_path / "runs" / "digits").glob("*/checkpoints/best-*.ckpt")
    shutil.rmtree(cache)  # the checkpoint holds every weight: nothing reads the pretrained ones again
    main(["predict", "--ckpt_path", str(best), "--trainer.logger=false", *QUIET])
    main(["export", "--ckpt_path", str(best), "--format", "onnx", "--batch_sizes", "1", "--output", "served"])
    out = capsys.readouterr().err
    assert "pretrained weights from" not in out and "onnx batch 1: max |difference|" in out
    assert json.loads(Path("served/preprocess.json").read_text())["mean"] == [0.449]  # as the run normalised
    again = forkserver.run(fit, capture_output=True, text=True, timeout=300, env=env)  # no cache, no network
    errors = [line for line in again.stderr.splitlines() if line.startswith("error:")]
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert len(errors) == 1 and f"weights: hub: timm's {NAME} (timm/{NAME}.r160_in1k) is not in the local" in errors[0]
    assert len(list((tmp_path / "runs" / "digits").iterdir())) == 2  # the fit's and the predict's: none left by it


@pytest.mark.slow
def test_under_ddp_the_unfrozen_backbone_trains_as_one_model_on_both_ranks(tmp_path: Path) -> None:
    """Lightning's BackboneFinetuning switches requires_grad off before DDP wraps the model, so DDP never
    syncs the backbone once it trains (Lightning issue 20340): each rank drifts apart, silently."""
    path, saved = pretrained_file(tmp_path)
    dump = tmp_path / "ranks"
    command = [sys.executable, "-m", "kiln", "fit", *LIMIT, *QUIET, "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"),
               *timm_net(path), "--model.init_args.freeze_backbone_epochs=1", "--model.init_args.backbone_lr_ratio=0.1",
               "--trainer.logger=false", "--run.test_after_fit=false", "--run.root", str(tmp_path / "runs"),
               "--trainer.callbacks+=probes.SaveRankWeights", f"--trainer.callbacks.dirpath={dump}"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    done = forkserver.run(command, capture_output=True, text=True, env=env, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (torch.load(dump / f"rank{r}.pt", weights_only=True, map_location="cpu")["state"] for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)  # one model, not two
    stem = f"net.model.{cfg().first_conv}.weight"
    assert not torch.allclose(rank0[stem], saved[stem.removeprefix("net.model.")].sum(1, keepdim=True))  # it trained
