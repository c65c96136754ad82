"""Seeds, folds and grids from one command, aggregated; finished runs are never trained again."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import LIMIT

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
