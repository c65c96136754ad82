"""Seeds, folds and grids from one command, aggregated; finished runs are never trained again."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CONFIGS, LIMIT

from kiln.cli import main
from kiln.data import DigitsDataModule

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
WIDTH = "model.init_args.net.init_args.width"


@pytest.mark.slow
def test_seeds_times_a_grid_aggregate_as_numpy_does_and_a_rerun_trains_nothing(capsys: pytest.CaptureFixture) -> None:
    command = ["multirun", "--seeds", "0-1", "--grid", f"{WIDTH}=8,16", "--", *LIMIT, *QUIET]
    main(command)
    root = Path("runs/multirun/multirun")
    folders = sorted(root.glob("width=*/seed*/*"))
    assert [f.parent.relative_to(root).as_posix() for f in folders] == [
        "width=16/seed0", "width=16/seed1", "width=8/seed0", "width=8/seed1"]  # fmt: skip
    with (root / "results.csv").open() as f:
        rows = {(r["cell"], r["metric"]): r for r in csv.DictReader(f)}
    for cell in ("width=8", "width=16"):
        accs = [json.loads((d / "metrics.json").read_text())["test"][0]["metrics"]["test/acc"]
                for d in folders if d.parent.parent.name == cell]  # fmt: skip
        row = rows[(cell, "test/acc")]
        assert float(row["mean"]) == pytest.approx(np.mean(accs)) and int(row["n"]) == 2
        assert float(row["std"]) == pytest.approx(np.std(accs, ddof=1))
        assert float(row["ci95"]) == pytest.approx(12.706 * np.std(accs, ddof=1) / np.sqrt(2))
    assert "| width=8 | test/acc |" in (root / "results.md").read_text()
    capsys.readouterr()
    main(command)
    assert capsys.readouterr().err.count("done before") == 4
    assert sorted(root.glob("width=*/seed*/*")) == folders  # nothing new trained


def test_folds_are_disjoint_cover_train_and_val_and_share_the_test_split() -> None:
    plain = DigitsDataModule(num_workers=0)
    plain.setup()
    rows = lambda data: {tuple(x.flatten().tolist()) for x in data.inputs}  # noqa: E731
    pool = rows(plain.train_set) | rows(plain.val_set)
    held_out = []
    for fold in range(5):
        data = DigitsDataModule(num_workers=0, num_folds=5, fold=fold)
        data.setup()
        assert rows(data.train_set) | rows(data.val_set) == pool and not rows(data.train_set) & rows(data.val_set)
        assert torch.equal(data.test_set.inputs, plain.test_set.inputs)  # type: ignore[union-attr]
        held_out.append(rows(data.val_set))
    assert sum(len(h) for h in held_out) == len(pool) and set().union(*held_out) == pool  # disjoint, covering
    data = DigitsDataModule(num_workers=0, num_folds=5, fold=0)
    data.setup()
    assert torch.bincount(data.val_set.labels, minlength=10).min() >= 20  # type: ignore[union-attr, arg-type]  # stratified


@pytest.mark.slow
def test_subprocess_runs_take_a_ddp_preset_and_aggregate_like_the_others(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kiln", "multirun", "--seeds", "3", "--subprocess", "--",
               *LIMIT, *QUIET, "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "WANDB_MODE": "disabled"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr
    (run_dir,) = (tmp_path / "runs" / "multirun" / "multirun" / "base" / "seed3").iterdir()
    tested = json.loads((run_dir / "metrics.json").read_text())["test"][0]["metrics"]["test/acc"]
    with (tmp_path / "runs" / "multirun" / "multirun" / "results.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if r["metric"] == "test/acc")
    assert float(row["mean"]) == pytest.approx(tested) and int(row["n"]) == 1


def test_a_ddp_preset_in_process_stops_multirun_in_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["multirun", "--seeds", "0-2", "--", *LIMIT, *QUIET, "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("add --subprocess") == 2  # the run's line and the command's: not once per seed
    assert not Path("runs/multirun").exists()  # no empty folders left behind
