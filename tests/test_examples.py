"""Every research example through every command: fit, a mid-epoch stop and its exact resume, test and predict
from the checkpoint alone, a 2-seed multirun, a 2-trial sweep, an export (and inference on files where the input
is one) and the run read back by ``kiln.results``."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from kiln import results
from kiln.cli import build_cli
from kiln.cli.from_checkpoint import rebuild
from kiln.commands.boundary import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHORT = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2",
         "--trainer.limit_test_batches=2", "--trainer.limit_predict_batches=2", "--trainer.logger=false",
         "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]  # fmt: skip
# a multirun's and a sweep's runs: what they add is around the runs (seeds, trials, aggregates), not in their steps
QUICK = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
         "--trainer.limit_test_batches=1"]  # fmt: skip
# example -> (its experiment, the columns predictions.csv starts with, what its export takes, its own settings)
EXAMPLES = {
    "digits": ("digits", ["index", "label", "predicted", "p0"], "float32", []),
    "regression": ("friedman", ["index", "target", "prediction"], "float32", []),
    # its default batch, 64 sequences of 64 tokens, took 0.14 s a step: 16 serve as well
    "language_model": ("sentences", ["index", "input", "predicted", "target"], "int64",
                       ["--data.init_args.batch_size=16"]),
}  # fmt: skip


class StopAt(Callback):
    """Sends this process a SIGTERM once training reaches ``step``, as a cluster's time limit would."""

    def __init__(self, step: int = 6) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def last(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")


def newest(root: Path, pattern: str) -> Path:
    return sorted(root.glob(pattern))[-1]


@pytest.mark.slow
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_every_command_serves_the_example(example: str, tmp_path: Path) -> None:
    experiment, columns, dtype, own = EXAMPLES[example]
    args = ["-c", str(CONFIGS / "experiment" / f"{experiment}.yaml"), *SHORT, *own]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    main(["fit", *args, "--run.root", str(whole)])
    with pytest.raises(SystemExit) as stop:  # a SIGTERM mid-epoch saves at the step, then the same command resumes
        main(["fit", *args, "--run.root", str(stopped), "--trainer.callbacks+=test_examples.StopAt"])
    assert stop.value.code == 143
    run = newest(stopped, f"{experiment}/2*")
    assert last(run)["global_step"] == 6  # epoch 1, batch 2 of 4
    main(["fit", *args, "--run.root", str(stopped), "--ckpt_path", "last"])
    a, b = last(newest(whole, f"{experiment}/2*")), last(run)
    assert a["global_step"] == b["global_step"] == 8
    assert all(torch.equal(value, b["state_dict"][key]) for key, value in a["state_dict"].items())  # bitwise

    checkpoint = run / "checkpoints" / "last.ckpt"  # alone: no config given
    tested = build_cli(["test", "--ckpt_path", str(checkpoint), "--trainer.limit_test_batches=2", *SHORT[-2:]])
    # (the default logger, W&B, disabled in tests: its table of confident mistakes steps aside for non-class data)
    after_fit = [t for t in json.loads((run / "metrics.json").read_text())["test"] if t["step"] == 8]
    scored = {k: v.item() for k, v in tested.trainer.callback_metrics.items() if k in after_fit[0]["metrics"]}
    assert scored == pytest.approx(after_fit[0]["metrics"], rel=1e-6)  # the same weights, not a new network
    main(["predict", "--ckpt_path", str(checkpoint), *SHORT[-3:], "--trainer.limit_predict_batches=1"])
    with newest(stopped, f"{experiment}/predict-*/predictions.csv").open() as f:  # beside the run
        table = list(csv.reader(f))
    assert table[0][: len(columns)] == columns and len(table) > 1

    quick = [*args, *QUICK]
    main(["multirun", "--seeds", "0-1", "--root", str(tmp_path / "multirun"), "--", *quick])
    assert len(results.multirun(newest(tmp_path / "multirun", "*"))) > 0
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(json.dumps({"name": example, "metric": "val/loss", "n_trials": 2, "args": quick, "space": {
        "model.init_args.optimizer.init_args.lr": {"low": 1e-4, "high": 1e-2, "log": True}}}))  # fmt: skip
    main(["sweep", "-c", str(sweep), "--root", str(tmp_path / "sweeps")])
    assert [t.state.name for t in results.sweep(tmp_path / "sweeps" / example).trials] == ["COMPLETE"] * 2

    main(["export", "--ckpt_path", str(checkpoint), "--format", "onnx", "--samples", "64"])
    model, data = rebuild(checkpoint)  # the export run as a user runs it, against the module's own forward
    x = next(iter(data.test_dataloader()))[0]
    session = onnxruntime.InferenceSession(run / "export" / "model.onnx")
    exported = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.inference_mode():
        assert np.abs(exported - model(x).numpy()).max() < 1e-4  # no softmax added, nothing dropped
    assert json.loads((run / "export" / "preprocess.json").read_text())["dtype"] == dtype
    if example == "regression":  # samples in a file: kiln infer, without torch
        np.save(tmp_path / "x.npy", np.random.default_rng(0).random((3, 10), dtype=np.float32))
        main(["infer", "--model", str(run / "export" / "model.onnx"), "--output", str(tmp_path / "p.csv"),
              str(tmp_path / "x.npy")])  # fmt: skip
        assert (tmp_path / "p.csv").read_text().splitlines()[0] == "path,sample,prediction"

    listed = results.runs(stopped)
    assert set(listed.status[~listed.run.str.startswith("test-")]) == {"finished"}  # the fits (`test` ran in-process)
    best = json.loads((run / "metrics.json").read_text())["val"]["best"]["val/loss"]
    assert listed.loc[listed.run == run.name, "val/loss @best"].item() == pytest.approx(best)
