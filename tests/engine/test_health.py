"""Health checks: inject each fault and check that the run stops (or warns) the way it says."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from faulty import NaNAtSteps
from helpers import CONFIGS, LIMIT, callback
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count as readable
from PIL import Image
from torch.optim import Optimizer

from kiln import results
from kiln.callbacks import BatchSanityCheck, GradNormMonitor, NonFiniteGuard, OverfitReport
from kiln.callbacks.batch_checks import check_batch
from kiln.cli import KilnCLI, build_cli
from kiln.commands.boundary import main
from kiln.errors import HealthCheckError, KilnError
from research.data import DigitsDataModule
from research.models import Classifier


def params(cli: KilnCLI) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in cli.model.state_dict().items()}


def nan_net_config(tmp_path: Path, steps: list[int], extra: str = "") -> str:
    config = tmp_path / "nan.yaml"
    config.write_text(
        "model:\n  init_args:\n    net:\n      class_path: faulty.NaNAtSteps\n"
        f"      init_args: {{steps: {steps}, in_channels: 1, num_classes: 10}}\n"
        "trainer:\n  max_epochs: 4\n  limit_train_batches: 3\n  limit_val_batches: 2\n" + extra
    )
    return str(config)


# host: the verdict read every step (CPU's auto); device: kept on the device and read at each epoch end, before
# the checkpoints (CUDA's auto with a fused optimizer, forced here on the CPU, where fused AdamW has it too)
MODES = ["host", pytest.param("device", marks=pytest.mark.slow)]


@pytest.mark.parametrize("mode", MODES)
def test_nan_at_step_k_stops_there_and_no_checkpoint_holds_it(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    k = 7  # epoch 2, batch 1: epochs 0 and 1 ended with checkpoints at step 6
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "-c", nan_net_config(tmp_path, [k]), "--non_finite.mode", mode])
    assert exit_info.value.code == 1
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1
    assert f"non-finite training step {k} " in error[0] and "loss=nan" in error[0]
    assert "first non-finite gradient: net." in error[0]
    (run_dir,) = Path("runs/digits").iterdir()
    assert results.status(run_dir) == ("failed", error[0])  # what kiln.results lists for the run
    checkpoints = list(Path("runs/digits").glob("*/checkpoints/*.ckpt"))
    assert {p.name.split("-")[0] for p in checkpoints} == {"best", "last.ckpt"}
    for path in checkpoints:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
        assert ckpt["global_step"] < k
        assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())


@pytest.mark.parametrize("mode", MODES)
def test_skip_mode_skips_two_steps_then_stops_at_the_third(mode: str, tmp_path: Path) -> None:
    skip = ["--non_finite.action", "skip", "--non_finite.max_skips", "2", "--trainer.logger", "false"]
    skip += ["--non_finite.mode", mode]
    cli = build_cli(["-c", nan_net_config(tmp_path, [4, 8]), *skip], run=False)
    guard = callback(cli, NonFiniteGuard)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert guard.skipped == 2
    assert cli.trainer.global_step == 4 * 3  # skipped steps still count as steps
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())
    assert float(cli.trainer.callback_metrics["health/skipped_steps"]) == 2

    cli = build_cli(["-c", nan_net_config(tmp_path, [1, 2, 3]), *skip], run=False)
    with pytest.raises(HealthCheckError, match=r"non-finite training step 3 .*2 steps were already skipped"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)


def test_label_out_of_range_stops_before_the_first_optimizer_step() -> None:
    cli = build_cli([*LIMIT, "--data", "faulty.LabelsOutOfRange", "--data.num_workers", "0"], run=False)
    before = params(cli)
    with pytest.raises(HealthCheckError) as err:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    message = str(err.value)
    assert message.startswith("train batch 0 of epoch 0: label 10 of sample") and "outside [0, 10)" in message
    assert cli.trainer.global_step == 0
    after = params(cli)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_batch_unlike_the_datas_declaration_stops_before_the_first_step() -> None:
    cli = build_cli([*LIMIT, "--data", "faulty.MissingChannel", "--data.num_workers", "0"], run=False)
    with pytest.raises(HealthCheckError, match=r"val batch 0: inputs have shape \(64, 8, 8\), with no channel dimens"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 0


def test_constant_labels_warn() -> None:
    cli = build_cli([*LIMIT, "--data", "faulty.ConstantLabels", "--data.num_workers", "0"], run=False)
    with pytest.warns(UserWarning, match="all 64 labels are 3"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    check = callback(cli, BatchSanityCheck)
    assert any("never appear" in w for w in check.warnings)
    assert any("class 3 is 100%" in w for w in check.warnings)


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        ((torch.zeros(2, 1, 8, 8, dtype=torch.uint8), torch.zeros(2, dtype=torch.long)), "dtype torch.uint8"),
        ((torch.zeros(2, 8, 8), torch.zeros(2, dtype=torch.long)), r"shape \(2, 8, 8\), with no channel dimension"),
        ((torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.long)), r"shape \(2, 3, 8, 8\); the data declares"),
        ((torch.zeros(2), torch.zeros(2, dtype=torch.long)), r"shape \(2,\), expected \(batch, ...\)"),
        ((torch.full((2, 1, 8, 8), float("nan")), torch.zeros(2, dtype=torch.long)), r"NaN/Inf in samples \[0, 1\]"),
        ((torch.zeros(2, 1, 8, 8), torch.tensor([-1, 2])), r"label -1 of sample 0 is outside \[0, 10\)"),
        ((torch.zeros(2, 1, 8, 8), torch.zeros(2)), "but the data declares 10 classes: class labels are integers"),
        (
            (torch.zeros(2, 1, 8, 8), torch.tensor([[[0, 1], [2, 12]]] * 2)),
            r"label 12 of sample 0 at \(1, 1\) is outside",
        ),
    ],
)
def test_check_batch_names_the_field(batch: tuple, match: str) -> None:
    with pytest.raises(HealthCheckError, match=match):
        check_batch(batch, "train batch 0", num_classes=10, input_shape=(1, 8, 8))


def test_check_batch_takes_token_ids_and_real_valued_targets_where_the_data_declares_no_classes() -> None:
    tokens = torch.randint(0, 96, (4, 16))
    assert check_batch((tokens, torch.randint(0, 96, (4, 16))), "train batch 0", None, input_shape=(16,)) == []
    assert check_batch((torch.rand(4, 10), torch.randn(4) * 5), "train batch 0", None, input_shape=(10,)) == []
    with pytest.raises(HealthCheckError, match=r"targets contain NaN/Inf in samples \[1\]"):
        check_batch((torch.rand(4, 10), torch.tensor([1.0, float("nan"), 0.0, 2.0])), "train batch 0", None)


def test_check_batch_takes_dense_class_labels_and_still_checks_the_inputs() -> None:
    """A segmentation's (B, H, W) masks with num_classes declared were refused as "not 1-D integers"; the way out,
    leaving the check out, lost the NaN and shape checks too."""
    masks = torch.randint(0, 4, (2, 8, 8))
    assert check_batch((torch.zeros(2, 3, 8, 8), masks), "val batch 0", num_classes=4, input_shape=(3, 8, 8)) == []
    with pytest.raises(HealthCheckError, match=r"inputs contain NaN/Inf in samples \[0, 1\]"):
        check_batch((torch.full((2, 3, 8, 8), float("nan")), masks), "val batch 0", num_classes=4)


def test_check_batch_takes_any_declared_sample_shape_and_the_networks_channels() -> None:
    labels = torch.zeros(4, dtype=torch.long)
    for shape in [(40,), (2, 40), (3, 8, 8)]:
        check_batch((torch.zeros(4, *shape), labels), "train batch 0", num_classes=4, input_shape=shape)
    with pytest.raises(HealthCheckError, match=r"inputs have 1 channels, the network expects 3"):
        check_batch((torch.zeros(4, 1, 40), labels), "train batch 0", num_classes=4, channels=3)


def test_gradient_spike_is_reported_once_at_its_step(tmp_path: Path) -> None:
    config = tmp_path / "spike.yaml"
    config.write_text(
        "model:\n  init_args:\n    net:\n      class_path: faulty.GradSpikeAtStep\n"
        "      init_args: {step: 25, in_channels: 1, num_classes: 10}\n"
        "trainer:\n  max_epochs: 2\n  limit_train_batches: 20\n  limit_val_batches: 1\n"
    )
    cli = build_cli(["-c", str(config), "-c", str(CONFIGS / "logger" / "csv.yaml")], run=False)
    monitor = callback(cli, GradNormMonitor)
    monitor.layer_every_n_steps = 30
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert [step for step, _, _ in monitor.spikes] == [25]
    assert (monitor.report() or "").startswith("gradient norm spikes (over 10x the running median) at 1 step: the")
    with (Path(cli.trainer.default_root_dir) / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows if r["grad/total_norm"]] == ["9", "19", "29", "39"]  # every logging step
    # per-layer norms at steps 0 and 30 alone: Lightning's self.log wrote them again at each logging step after
    assert [(r["step"], r["epoch"]) for r in rows if r["grad/net.head.1.bias"]] == [("0", "0"), ("30", "1")]


def test_non_finite_norms_are_not_spikes_and_stay_out_of_the_running_median() -> None:
    monitor = GradNormMonitor(check_every_n_steps=1)
    norms = [1.0] * 12 + [float("nan"), float("inf")] + [1.0] * 5 + [50.0]  # NaN/Inf: NonFiniteGuard's steps
    for step, norm in enumerate(norms):
        monitor._pending.append(torch.tensor(norm))
        monitor._check_spikes(step)
    assert [step for step, _, _ in monitor.spikes] == [19]
    assert "the first at step 19, the largest 50x at step 19" in (monitor.report() or "")


def test_pictures_are_saved_logged_and_of_the_expected_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    main(["fit", *LIMIT])
    (run_dir,) = Path("runs/digits").iterdir()
    tested = [Path(result["checkpoint"]).stem for result in json.loads((run_dir / "metrics.json").read_text())["test"]]
    matrices = sorted(p.name for p in run_dir.glob("confusion_matrix*.png"))  # one per tested checkpoint
    assert matrices == sorted(f"confusion_matrix-{stem}.png" for stem in tested)
    grid, matrix = Image.open(run_dir / "batch_grid.png"), Image.open(run_dir / matrices[-1])
    grid.verify()
    matrix.verify()
    assert grid.size == (8 * 96, 4 * (96 + 18))  # 32 of the 64 images, 8 columns of 96-pixel cells + captions
    assert matrix.size[0] > 1.8 * matrix.size[1]  # counts beside shares (tests/engine/test_figures.py reads their text)
    media = run_dir.glob("wandb/offline-run-*/files/media/images/**/*.png")
    names = sorted(p.name.rsplit("_", 2)[0] for p in media)
    assert names == ["batch_grid", *["confusion_matrix"] * len(tested)]


@pytest.mark.slow
def test_the_default_model_overfits_one_batch_with_the_overfit_preset() -> None:
    cli = build_cli(["fit", "-c", str(CONFIGS / "debug" / "overfit.yaml"), "--trainer.logger", "false"])
    report = callback(cli, OverfitReport)
    assert cli.trainer.global_step == 150  # one batch, 150 epochs
    assert report.last < 0.05 < 1 < report.first
    assert report.message.startswith("overfit check passed")


def test_parameter_summary_counts_total_trainable_and_frozen(capsys: pytest.CaptureFixture) -> None:
    cli = build_cli([*LIMIT, "--trainer.logger", "false"], run=False)
    for p in cli.model.net.features.parameters():
        p.requires_grad_(False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    out = " ".join(capsys.readouterr().out.split())
    frozen = sum(p.numel() for p in cli.model.net.features.parameters())
    total = sum(p.numel() for p in cli.model.parameters())
    assert 0 < frozen < total
    assert f"Non-trainable params: {readable(frozen).strip()}" in out
    assert f"Trainable params: {readable(total - frozen).strip()}" in out
    assert f"Total params: {readable(total).strip()}" in out
    assert f"Total estimated model params size (MB): {total * 4 / 1e6:.3f}" in out


DEFERRED = ["--non_finite.mode", "device", "--non_finite.check_every_n_steps", "2", "--trainer.logger", "false"]


def test_deferred_check_skips_on_the_device_and_stops_at_the_next_read(tmp_path: Path) -> None:
    k = 7  # epoch 2, batch 1; the host reads the verdicts at steps 2, 4, 6, 8 and before each checkpoint
    cli = build_cli(["-c", nan_net_config(tmp_path, [k]), *DEFERRED], run=False)
    error = rf"non-finite training step {k} \(loss=nan, first non-finite gradient: net\.[^;]*; found at step 8"
    with pytest.raises(HealthCheckError, match=error):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 8  # one finite step after the bad one, then the read stopped it
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())  # the fused step skipped itself
    optimizer = cli.trainer.optimizers[0]
    assert not hasattr(optimizer, "found_inf")  # the optimizer is left as it was given
    assert {int(state["step"]) for state in optimizer.state.values()} == {8 - 1}  # AdamW counted 7 steps
    for path in Path(cli.trainer.default_root_dir).glob("checkpoints/*.ckpt"):
        assert torch.load(path, weights_only=True, map_location="cpu")["global_step"] < k


@pytest.mark.slow
def test_deferred_skip_mode_counts_skips_on_the_device(tmp_path: Path) -> None:
    skip = ["--non_finite.action", "skip", "--non_finite.max_skips", "2"]
    cli = build_cli(["-c", nan_net_config(tmp_path, [4, 8]), *DEFERRED, *skip], run=False)
    guard = callback(cli, NonFiniteGuard)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert guard.skipped == 2 and cli.trainer.global_step == 12
    assert float(cli.trainer.callback_metrics["health/skipped_steps"]) == 2
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())
    assert {int(state["step"]) for state in cli.trainer.optimizers[0].state.values()} == {12 - 2}
    last = torch.load(
        Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu"
    )
    assert last["callbacks"]["NonFiniteGuard"]["skipped"] == 2  # a resumed run keeps counting

    cli = build_cli(["-c", nan_net_config(tmp_path, [1, 2, 3]), *DEFERRED, *skip], run=False)
    with pytest.raises(HealthCheckError, match=r"non-finite training step 3 .*2 steps were already skipped"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)


def test_deferred_check_with_an_unfused_optimizer_is_refused_naming_the_fix() -> None:
    unfused = ["--model.init_args.optimizer.init_args.fused", "false", *LIMIT]
    cli = build_cli([*unfused, *DEFERRED], run=False)
    with pytest.raises(KilnError, match=r"non_finite.mode=device needs a fused optimizer.*AdamW.*fused: true"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)


class SyncFreeGuard(NonFiniteGuard):
    """The guard with CUDA's sync detector armed around its per-step check: any host sync raises."""

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer) -> None:
        torch.cuda.set_sync_debug_mode("error")
        try:
            super().on_before_optimizer_step(trainer, pl_module, optimizer)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_guard_skips_the_one_non_finite_step_and_leaves_the_weights_finite() -> None:
    guard = SyncFreeGuard(action="skip", check_every_n_steps=5)
    model = Classifier(NaNAtSteps(steps=[3], in_channels=1, num_classes=10), num_classes=10)  # fused AdamW
    trainer = Trainer(accelerator="gpu", devices=1, max_steps=12, limit_val_batches=0, callbacks=[guard],
                      logger=False, enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=64, num_workers=0))
    assert guard.skipped == 1 and all(torch.isfinite(p).all() for p in model.parameters())


def test_a_stop_found_while_a_checkpoint_is_written_waits_for_the_next_hook() -> None:
    guard = NonFiniteGuard(mode="device")
    guard._bad, guard._over_step, guard._over_loss = torch.tensor(1), torch.tensor(3), torch.tensor(float("nan"))
    guard._over_list = guard._over_param = torch.tensor(-1)
    assert guard.state_dict() == {"skipped": 1}  # a checkpoint's state_dict never raises (Lightning is mid-save)
    with pytest.raises(HealthCheckError, match="non-finite training step 3"):
        guard.on_train_epoch_end(None, None)  # type: ignore[arg-type]  # the next hook stops the run


def test_the_gradient_norm_is_computed_once_per_step_for_both_callbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = torch._foreach_norm

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    cli = build_cli([*LIMIT, "--trainer.max_epochs", "1", "--trainer.logger", "false"], run=False)
    owners = [c for c in cli.trainer.callbacks if isinstance(c, NonFiniteGuard | GradNormMonitor)]  # type: ignore[attr-defined]
    assert len(owners) == 2  # both need the norm each step
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert len(calls) == cli.trainer.global_step == 5
