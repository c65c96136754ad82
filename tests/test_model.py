"""The classifier learns, reloads from a checkpoint alone, and schedules its learning rate."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from kiln.cli import build_cli
from kiln.training.schedules import WarmupCosineLR
from research.models import Classifier
from research.nets import SmallCNN

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_checkpoint_alone_rebuilds_model_with_identical_predictions() -> None:
    cli = build_cli(
        [
            "fit",
            "-c",
            str(CONFIGS / "debug" / "limit.yaml"),
            "--trainer.logger",
            "false",
            "--run.test_after_fit",
            "false",
        ]
    )
    last = Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    assert last.is_file()
    loaded = Classifier.load_from_checkpoint(last, map_location="cpu")  # no YAML, no net passed
    assert isinstance(loaded.net, SmallCNN)
    x = torch.randn(16, 1, 8, 8)
    cli.model.eval()
    loaded.eval()
    with torch.inference_mode():
        assert torch.equal(cli.model(x), loaded(x))
    # the checkpoint holds plain data only: torch's safe loader reads it
    torch.load(last, weights_only=True, map_location="cpu")


@pytest.mark.parametrize("experiment", ["friedman", "sentences"])
def test_every_example_model_rebuilds_from_its_checkpoint_alone(experiment: str) -> None:
    """One way to save hyper-parameters (kiln.training.hparams.save_config): the regressor ignored its net's config."""
    cli = build_cli(["fit", "-c", str(CONFIGS / "experiment" / f"{experiment}.yaml"), "-c", str(CONFIGS / "debug" /
                     "limit.yaml"), "--trainer.logger", "false", "--run.test_after_fit", "false"])  # fmt: skip
    last = Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    loaded = type(cli.model).load_from_checkpoint(last, map_location="cpu").eval()
    batch = next(iter(cli.datamodule.val_dataloader()))[0][:4]
    with torch.inference_mode():
        assert torch.equal(cli.model.eval()(batch), loaded(batch))


def test_model_built_in_python_stores_no_objects_in_hparams(tmp_path: Path) -> None:
    model = Classifier(net=SmallCNN(), num_classes=10)
    assert "net" not in model.hparams and "optimizer" not in model.hparams
    assert model.hparams["num_classes"] == 10
    assert model.hparams_initial == model.hparams  # what loggers record: a copy of the network was kept there


def test_predict_step_returns_probabilities() -> None:
    model = Classifier(net=SmallCNN(num_classes=4), num_classes=4).eval()
    probs = model.predict_step((torch.randn(5, 1, 8, 8), torch.zeros(5)), 0)
    assert probs.shape == (5, 4)
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(5))


def test_warmup_cosine_schedule() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = WarmupCosineLR(optimizer, warmup_fraction=0.1)
    scheduler.set_total_steps(100)
    lrs = []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.1)  # (step + 1) / warmup_steps
    assert lrs[9] == pytest.approx(1.0)  # end of warm-up
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))  # then only decays
    assert lrs[-1] < 0.01
    assert lrs[55] == pytest.approx(0.5, abs=0.02)  # cosine half-way point


def test_warmup_cosine_stepped_per_epoch_is_refused_in_one_line(capsys: pytest.CaptureFixture) -> None:
    from kiln.commands.boundary import main

    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model.init_args.scheduler_interval", "epoch", "--trainer.logger", "false"])
    assert exit_.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: model.scheduler_interval: epoch steps WarmupCosineLR")


def test_a_model_built_in_python_gets_the_default_configs_optimizer_and_schedule() -> None:
    models = [build_cli(run=False).model, Classifier(net=SmallCNN(), num_classes=10)]
    optimizers = [m.optimizer_factory([torch.nn.Parameter(torch.zeros(1))]) for m in models]
    assert type(optimizers[0]) is type(optimizers[1]) and optimizers[0].defaults == optimizers[1].defaults
    schedules = [m.scheduler_factory(o) for m, o in zip(models, optimizers, strict=True) if m.scheduler_factory]
    settings = [(s.warmup_fraction, s.min_lr_ratio, s.total_steps) for s in schedules if isinstance(s, WarmupCosineLR)]
    assert len(settings) == 2 and settings[0] == settings[1]


def test_the_test_loss_is_the_mean_over_samples_not_over_batches() -> None:
    """A batch of 5 and one of 3: the epoch's loss weighs each sample once (it was the mean of the batch means)."""
    torch.manual_seed(0)
    model = Classifier(net=SmallCNN(num_classes=4), num_classes=4).eval()
    batches = [(torch.randn(n, 1, 8, 8), torch.randint(0, 4, (n,))) for n in (5, 3)]
    with torch.inference_mode():
        for i, batch in enumerate(batches):
            model.test_step(batch, i)
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        expected = torch.nn.functional.cross_entropy(model(x), y)
    assert float(model.test_loss.compute()) == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize("experiment", ["friedman", "sentences"])
def test_the_model_summary_counts_the_flops_of_every_example(experiment: str) -> None:
    """Lightning's summary prints "Total FLOPs: 0" for a module without an example input; each example gives one."""
    from lightning.pytorch.utilities.model_summary import summarize

    cli = build_cli(["fit", "-c", str(CONFIGS / "experiment" / f"{experiment}.yaml"), "--trainer.fast_dev_run", "1",
                     "--trainer.logger", "false", "--run.test_after_fit", "false"])  # fmt: skip
    assert summarize(cli.model).total_flops > 0
