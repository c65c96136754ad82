"""``kiln.results``: runs, curves, configs, sweeps and multiruns read back from the files they wrote; synthetic
run folders for each status, and real runs for each logger's history (W&B's offline file is a private format)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from helpers import CONFIGS, LIMIT

from kiln import results
from kiln.cli import build_cli


def make_run(root: Path, name: str, state: str | None, lr: float, tested: bool = False, last: bool = False) -> Path:
    run_dir = root / "digits" / name
    (run_dir / "checkpoints").mkdir(parents=True)
    config = {"trainer": {"max_epochs": 3, "limit_train_batches": 1.0}, "model": {"lr": lr, "width": 16}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if state is not None:
        (run_dir / "status.json").write_text(json.dumps({"status": state, "detail": f"{state} line"}))
    if last:
        (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"state")
    if tested:
        metrics = {"epochs": 3, "global_step": 30, "wall_seconds": 4.5,
                   "val": {"monitor": "val/loss", "best": {"epoch": 2, "val/loss": 0.25}},
                   "test": [{"label": "best", "metrics": {"test/acc": 0.9}},
                            {"label": "last", "metrics": {"test/acc": 0.8}}]}  # fmt: skip
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
    (run_dir / "metrics.csv").write_text("epoch,step,train/loss,val/loss\n0,9,1.5,\n0,9,,1.2\n1,19,0.9,\n1,19,,0.7\n")
    return run_dir


def test_runs_lists_each_status_metric_by_weights_and_the_keys_that_vary(tmp_path: Path) -> None:
    make_run(tmp_path, "a-finished", "finished", 0.1, tested=True, last=True)
    make_run(tmp_path, "b-failed", "failed", 0.2)
    make_run(tmp_path, "c-interrupted", "interrupted", 0.3, last=True)
    make_run(tmp_path, "d-killed", None, 0.3, last=True)  # no record: a run of an older kiln, or kill -9
    table = results.runs(tmp_path).set_index("run")
    assert table.status.to_dict() == {"a-finished": "finished", "b-failed": "failed",
                                      "c-interrupted": "interrupted", "d-killed": "resumable"}  # fmt: skip
    assert table.resumable.to_dict() == {"a-finished": False, "b-failed": False, "c-interrupted": True,
                                         "d-killed": True}  # fmt: skip
    assert table.loc["b-failed", "detail"] == "failed line"
    assert table.loc["a-finished", ["test/acc @best", "test/acc @last", "val/loss @best"]].tolist() == [0.9, 0.8, 0.25]
    assert "model.lr" in table and "model.width" not in table  # only what differs between the runs
    assert "model.width" in results.runs(tmp_path, keys="all")
    assert set(results.runs(tmp_path, keys=["model.width"]).columns) >= {"model.width", "path"}
    assert results.config_diff(table.path["a-finished"], table.path["b-failed"]).to_dict("index") == {
        "model.lr": {"a-finished": 0.1, "b-failed": 0.2}
    }


def test_curves_come_from_the_logged_points_and_a_metric_never_logged_is_named(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "a", "finished", 0.1)
    assert results.curve(run_dir, "val/loss").values.tolist() == [[9, 1.2], [19, 0.7]]
    assert results.curve(run_dir, "train/loss", x="epoch").values.tolist() == [[0, 1.5], [1, 0.9]]
    with pytest.raises(KeyError, match="'val/acc' was never logged; it logged train/loss, val/loss"):
        results.curve(run_dir, "val/acc")
    other = make_run(tmp_path, "b", "finished", 0.2)
    ax = results.plot_curves([run_dir, other], "val/loss")
    assert [line.get_label() for line in ax.get_lines()] == ["digits/a", "digits/b"]
    assert ax.get_ylabel() == "val/loss"
    cnn, gru = (make_run(tmp_path / "multirun" / name / "base" / "seed42", "r", "finished", 0.1) for name in "cg")
    ax = results.plot_curves([cnn, gru], "val/loss")  # was: seed42/r and seed42/r, alike
    assert [line.get_label() for line in ax.get_lines()] == ["c/base/seed42/digits/r", "g/base/seed42/digits/r"]
    ax = results.plot_curves([cnn, gru], "val/loss", labels=["CNN", "GRU"])
    assert [line.get_label() for line in ax.get_lines()] == ["CNN", "GRU"]


def test_a_sweep_and_a_multirun_read_back(tmp_path: Path) -> None:
    folder = tmp_path / "sweeps" / "tiny"
    folder.mkdir(parents=True)
    study = optuna.create_study(study_name="tiny", storage=f"sqlite:///{folder / 'study.db'}")
    study.optimize(lambda t: t.suggest_float("lr", 0.0, 1.0), n_trials=3)
    notices: list[str] = []
    heard = logging.Handler()
    heard.emit = lambda record: notices.append(record.getMessage())  # type: ignore[method-assign]
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    logging.getLogger("optuna").addHandler(heard)
    try:
        read = results.sweep("tiny", root=tmp_path / "sweeps")
    finally:
        logging.getLogger("optuna").removeHandler(heard)
        optuna.logging.set_verbosity(level)
    assert not [n for n in notices if "Study name was omitted" in n]  # Optuna's notice, in results.ipynb's output
    assert [t.value for t in read.trials] == [t.value for t in study.trials]
    assert results.trials(read)[["number", "params_lr"]].shape == (3, 2)
    with pytest.raises(FileNotFoundError, match="no sweep there"):
        results.sweep("missing", root=tmp_path / "sweeps")
    multirun = tmp_path / "multirun" / "width"
    multirun.mkdir(parents=True)
    (multirun / "results.csv").write_text(
        "cell,metric,mean,std,ci95,n\nwidth=16,test/acc @best,0.9,0.01,0.0248,3\nwidth=32,test/acc @best,0.95,,,1\n"
    )
    table = results.multirun("width", root=tmp_path / "multirun")
    assert table.loc["width=16", "test/acc @best"] == "0.9000 ± 0.0248 (n=3)"
    assert table.loc["width=32", "test/acc @best"] == "0.9500 (n=1)"
    assert results.multirun(multirun, raw=True).shape == (2, 6)


@pytest.mark.parametrize(
    "logger",
    ["wandb", pytest.param("csv", marks=pytest.mark.slow), pytest.param("tensorboard", marks=pytest.mark.slow)],
)
def test_a_real_runs_history_from_its_logger_matches_its_metrics(logger: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    extra = [] if logger == "wandb" else ["-c", str(CONFIGS / "logger" / f"{logger}.yaml")]
    cli = build_cli(["fit", *LIMIT, *extra])
    run_dir = Path(cli.trainer.default_root_dir)
    (row,) = results.runs("runs").to_dict("records")
    assert row["status"] == "finished"  # recorded by RunMetrics at the end of fit, outside a `kiln` command too
    val = results.curve(run_dir, "val/loss", x="epoch")
    assert val.epoch.tolist() == [0, 1]
    assert val["val/loss"].iloc[-1] == pytest.approx(row["val/loss @best"])  # the best epoch is the last here
    assert len(results.curve(run_dir, "train/loss")) >= 1
    assert [p.name.split("-")[0] for p in results.pictures(run_dir)] == ["batch_grid.png", "confusion_matrix"]


def test_a_run_killed_without_a_word_or_built_and_never_run_is_stopped_not_running(tmp_path: Path) -> None:
    """A kill -9 (or `build_cli(run=False)` in a process that then ended) left status.json at `running` for good,
    and kiln.results listed such runs as running."""
    command = [sys.executable, "-c", "from kiln.cli import build_cli; build_cli(['--run.root', 'runs'], run=False)"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "WANDB_MODE": "disabled"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = (tmp_path / "runs" / "digits").iterdir()
    assert json.loads((built / "status.json").read_text())["status"] == "running"  # what the process left
    assert results.status(built)[0] == "stopped"
    held = subprocess.Popen([sys.executable, "-c", "import time, pathlib; from kiln.runs import record; h = record."
                             f"hold(pathlib.Path({str(built)!r})); print('held', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert held.stdout is not None and held.stdout.readline().strip() == "held"
        assert results.status(built)[0] == "running"  # a live process holds it
    finally:
        held.kill()
        held.wait()
