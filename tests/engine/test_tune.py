"""`kiln tune lr`: a range test on the configured optimizer (a callable in YAML), its suggestion, its files, and a
fit after it that is bitwise the fit without it."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import forkserver
import pytest
import torch
import yaml
from helpers import CONFIGS, LIMIT

from kiln.cli import build_cli
from kiln.commands.boundary import main

LR = "model.init_args.optimizer.init_args.lr"


def tuned(capsys: pytest.CaptureFixture, *args: str) -> tuple[Path, float]:
    main(["tune", "lr", *args])
    (folder,) = Path("runs/digits").glob("tune-*")
    rate = yaml.safe_load((folder / "tuned.yaml").read_text())["model"]["init_args"]["optimizer"]["init_args"]["lr"]
    assert f"suggested learning rate {rate:.3g}" in capsys.readouterr().err
    return folder, rate


@pytest.mark.slow
def test_the_range_test_suggests_a_rate_a_fit_after_it_is_the_fit_without_it_and_8_epochs_at_it_reach_98_percent(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    folder, rate = tuned(capsys)
    assert 1e-4 <= rate <= 1.0
    assert {p.name for p in folder.iterdir()} == {"lr_find.csv", "lr_find.png", "tuned.yaml"}
    rows = list(csv.DictReader((folder / "lr_find.csv").open()))
    assert len(rows) >= 50 and float(rows[0]["lr"]) == pytest.approx(1e-7)
    assert [p.name for p in Path("runs/digits").iterdir()] == [folder.name]  # the test's own run left nothing

    after = build_cli(["fit", *LIMIT, "-c", str(folder / "tuned.yaml"), "--trainer.logger", "false"])
    alone = tmp_path / "alone"  # a process that never ran the test
    done = forkserver.run([sys.executable, "-m", "kiln", "fit", *LIMIT, f"--{LR}", str(rate), "--trainer.logger",
                           "false", "--run.root", str(alone)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (other,) = alone.glob("digits/*/checkpoints/last.ckpt")
    ours = torch.load(Path(after.trainer.default_root_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    theirs = torch.load(other, weights_only=True)
    assert ours["state_dict"].keys() == theirs["state_dict"].keys()
    assert all(torch.equal(v, theirs["state_dict"][k]) for k, v in ours["state_dict"].items())

    # in 8 of the default experiment's 30 epochs (0.994 measured): a rate that only the full schedule rescues fails
    cli = build_cli(["fit", "-c", str(folder / "tuned.yaml"), "--trainer.logger", "false", "--trainer.max_epochs", "8"])
    assert (cli.test_metrics or {})["test/acc"] >= 0.98


def test_tune_mistakes_are_one_line(capsys: pytest.CaptureFixture) -> None:
    ddp = ["tune", "lr", "--", "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml")]  # its rank 1 exited; rank 0 hung
    for args, says in ((["tune"], "say what to tune"), (["tune", "lr", "--min_lr", "1", "--max_lr", "0.1"],
                                                         "need 0 < --min_lr < --max_lr"),
                       (ddp, "cannot start inside `kiln tune lr`: it runs one process; add --trainer.devices 1 after --"
                        )):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            main(args)
        assert stop.value.code == 2 and says in capsys.readouterr().err
    assert not Path("runs").exists()
