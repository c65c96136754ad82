"""predictions.csv holds every output a predict_step returns, one row per sample, or says in one line why not."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from kiln.callbacks import PredictionWriter
from kiln.cli.from_checkpoint import rebuild
from kiln.commands.boundary import main
from kiln.errors import UsageError


class Outputs(LightningModule):
    """A plain module whose predict_step returns a tuple, a dict, or one number for the batch."""

    def __init__(self, returns: str) -> None:
        super().__init__()
        self.returns, self.net = returns, torch.nn.Linear(4, 3)

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        out = self.net(batch[0])
        if self.returns == "tuple":
            return out[:, 0], out
        if self.returns == "dict":
            return {"score": out[:, 0], "logits": out}
        return out.sum()


def predict(returns: str, folder: Path) -> list[dict[str, str]]:
    data = TensorDataset(torch.randn(10, 4), torch.arange(10.0))
    trainer = Trainer(callbacks=[PredictionWriter(output_dir=str(folder))], logger=False, enable_progress_bar=False)
    trainer.predict(Outputs(returns), DataLoader(data, batch_size=4), return_predictions=False)
    with (folder / "predictions.csv").open() as f:
        return list(csv.DictReader(f))


OUTPUTS = [("tuple", ["prediction0", "prediction1"]), ("dict", ["score", "logits"])]


@pytest.mark.parametrize(("returns", "names"), OUTPUTS)
def test_each_output_of_a_tuple_or_a_dict_gets_its_columns(returns: str, names: list[str], tmp_path: Path) -> None:
    """A tuple's outputs were dropped: predictions.csv held the index alone, and the line said "0 rows"."""
    rows = predict(returns, tmp_path)
    first, many = names
    assert list(rows[0]) == ["index", "target", first, f"{many}_0", f"{many}_1", f"{many}_2"]
    assert [row["index"] for row in rows] == [str(i) for i in range(10)]
    assert all(row[first] == row[f"{many}_0"] for row in rows)  # the score is the first logit


def test_one_number_for_the_batch_is_one_line_and_no_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"returned a tensor of shape \(\), which makes no rows: return a tensor"):
        predict("sum", tmp_path)
    assert not list(tmp_path.iterdir())  # neither predictions.csv nor its partial file


def test_dense_predictions_and_targets_go_to_npy_files_beside_the_csv_row_for_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segmentation's predicted maps were saved nowhere: kiln predict stopped with "… make no CSV columns"."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    main(["fit", "--model", "probes.PixelNet", "--data", "probes.Masks", "--trainer.max_epochs", "1",
          "--trainer.logger", "false", "--run.test_after_fit", "false", "--run.root", str(tmp_path)])  # fmt: skip
    (last,) = tmp_path.glob("*/*/checkpoints/last.ckpt")
    main(["predict", "--ckpt_path", str(last), "--trainer.logger", "false"])
    (folder,) = tmp_path.glob("*/predict-*")
    with (folder / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(row["index"], row["array_row"]) for row in rows] == [(str(i), str(i)) for i in range(20)]
    predicted, target = np.load(folder / "predictions-prediction.npy"), np.load(folder / "predictions-target.npy")
    model, data = rebuild(last)
    data.setup("predict")
    x, masks = data.sets[1].tensors
    with torch.inference_mode():
        assert np.allclose(predicted, model(x).numpy(), atol=1e-6)  # the module's own output, row for row
    assert predicted.shape == (20, 2, 10, 10) and np.array_equal(target, masks.numpy())
    assert not list(folder.glob(".*partial*"))  # no staging folder or partial file left
