"""Seeds, folds and grids from one command, aggregated; finished runs are never trained again."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from pathlib import Path

import forkserver
import numpy as np
import pytest
import torch
from helpers import CONFIGS, LIMIT, PROBES

from kiln import results
from kiln.commands.boundary import main
from research.data import DigitsDataModule

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
WIDTH = "model.init_args.net.init_args.width"


def scored(run_dir: Path, which: str) -> float:
    """A run's test/acc of the ``best`` or ``last`` weights, from its metrics.json."""
    results = json.loads((run_dir / "metrics.json").read_text())["test"]
    return next(r["metrics"]["test/acc"] for r in results if which in r["label"].replace(" ", "").split("="))


@pytest.mark.slow
def test_seeds_times_a_grid_aggregate_as_numpy_does_and_a_rerun_trains_nothing(capsys: pytest.CaptureFixture) -> None:
    command = ["multirun", "--seeds", "0-1", "--grid", f"{WIDTH}=8,16", "--", *LIMIT, *QUIET]
    main(command)
    printed = capsys.readouterr()
    per_run = [line for line in printed.err.splitlines() if line.startswith(("width=8/seed", "width=16/seed"))]
    assert len(per_run) == 4 and all("test/acc @last" in line for line in per_run)  # one line per run ...
    assert "Run summary" not in printed.out + printed.err  # ... not each run's own console
    root = Path("runs/multirun/multirun")
    folders = sorted(root.glob("width=*/seed*/2*"))
    assert [f.parent.relative_to(root).as_posix() for f in folders] == [
        "width=16/seed0", "width=16/seed1", "width=8/seed0", "width=8/seed1"]  # fmt: skip
    with (root / "results.csv").open() as f:
        rows = {(r["cell"], r["metric"]): r for r in csv.DictReader(f)}
    for cell, which in [(c, w) for c in ("width=8", "width=16") for w in ("best", "last")]:
        accs = [scored(d, which) for d in folders if d.parent.parent.name == cell]  # each run's own, by weights
        row = rows[(cell, f"test/acc @{which}")]
        assert float(row["mean"]) == pytest.approx(np.mean(accs)) and int(row["n"]) == 2
        assert float(row["std"]) == pytest.approx(np.std(accs, ddof=1))
        assert float(row["ci95"]) == pytest.approx(12.706 * np.std(accs, ddof=1) / np.sqrt(2))
    report = (root / "results.md").read_text()
    assert "| width=8 | test/acc @best |" in report and "| width=8 | test/acc @last |" in report
    assert "@best: the checkpoint (and its epoch's validation) with the best val/loss" in report
    capsys.readouterr()
    damaged = folders[0] / "checkpoints" / "last.ckpt"  # a disk that filled, a copy cut short
    damaged.write_bytes(damaged.read_bytes()[:1000])
    main(command)
    err = capsys.readouterr().err
    assert err.count("done before with the same config") == 4
    assert f"width=16/seed0: its checkpoints last.ckpt no longer load (truncated or overwritten): its numbers stand, " \
        f"its weights are lost; delete {folders[0]} to train it again" in err  # fmt: skip
    assert sorted(root.glob("width=*/seed*/2*")) == folders  # nothing new trained
    listed = results.runs("runs/multirun")
    assert listed.set_index("path")["broken"].to_dict() == {
        str(f): "last.ckpt" if f == folders[0] else "" for f in folders
    }


@pytest.mark.slow
def test_a_rerun_with_other_settings_trains_again_and_reports_only_the_new_runs(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text("trainer:\n  limit_train_batches: 3\n")
    command = ["multirun", "--seeds", "0", "--", *LIMIT, *QUIET, "-c", str(extra)]
    main(command)
    root = Path("runs/multirun/multirun")
    (first,) = root.glob("base/seed0/2*")
    extra.write_text("trainer:\n  limit_train_batches: 4\n")  # the same command line, another config file
    capsys.readouterr()
    main(command)
    assert "trained before with other settings (trainer.limit_train_batches 3 -> 4): training again" in (
        capsys.readouterr().err
    )
    (second,) = set(root.glob("base/seed0/2*")) - {first}
    assert json.loads((second / "metrics.json").read_text())["global_step"] == 2 * 4  # the new settings
    with (root / "results.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if r["metric"] == "test/acc @last")
    assert int(row["n"]) == 1 and float(row["mean"]) == pytest.approx(scored(second, "last"))  # never the stale run


def test_an_empty_seed_range_and_every_run_failing_exit_non_zero(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["multirun", "--seeds", "3-1"])
    assert stop.value.code == 2 and "--seeds '3-1': an empty range" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # the net cannot take a width of 0: every run fails
        main(["multirun", "--seeds", "0-1", "--", *LIMIT, *QUIET, f"--{WIDTH}=0"])
    assert stop.value.code == 1 and "every run failed (2)" in capsys.readouterr().err


def test_folds_of_data_that_cannot_fold_are_one_line_naming_the_data_class(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The line named --data.init_args.num_folds, which the user never wrote (multirun adds it)."""
    with pytest.raises(SystemExit) as stop:
        main(["multirun", "--folds", "2", "--root", str(tmp_path), "--", "--data", "probes.PlainDigits"])
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines() == [
        "error: --folds: probes.PlainDigits takes no num_folds and fold; folds need a datamodule that cuts its train "
        "and val splits by them (kiln.data.TensorDataModule and its subclasses do)"
    ]
    assert not any(tmp_path.iterdir())  # nothing planned, nothing made


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
    assert torch.bincount(data.val_set.targets, minlength=10).min() >= 20  # type: ignore[union-attr, arg-type]  # stratified


@pytest.mark.slow
def test_subprocess_runs_take_a_ddp_preset_and_aggregate_like_the_others(tmp_path: Path) -> None:
    """With `-v`, which reaches each `kiln fit` process on its command line (an environment variable was written
    and read back in the same process for it)."""
    command = [sys.executable, "-m", "kiln", "-v", "multirun", "--seeds", "3", "--subprocess", "--",
               *LIMIT, *QUIET, "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml")]  # fmt: skip
    done = forkserver.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "WANDB_MODE": "disabled"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr  # both ranks' Lightning lines
    (run_dir,) = (tmp_path / "runs" / "multirun" / "multirun" / "base" / "seed3").iterdir()
    with (tmp_path / "runs" / "multirun" / "multirun" / "results.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if r["metric"] == "test/acc @last")
    assert float(row["mean"]) == pytest.approx(scored(run_dir, "last")) and int(row["n"]) == 1


def test_a_ddp_preset_in_process_stops_multirun_in_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["multirun", "--seeds", "0-2", "--", *LIMIT, *QUIET, "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("add --subprocess") == 2  # the run's line and the command's: not once per seed
    assert not Path("runs/multirun").exists()  # no empty folders left behind


@pytest.mark.slow
@pytest.mark.real_process  # a multirun's stop: no fork proof covers it
def test_a_stopped_multirun_sums_up_what_finished_and_another_array_tasks_rerun_resumes_the_cut_run(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rerun trained the cut run again from scratch in a new folder, and the stop wrote no aggregate. As
    another SLURM array task (a scancelled task's run, taken up by the next): it said "resuming … from its
    last.ckpt", then "no checkpoint under …: starting a new run", and trained it anew beside the cut folder."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    probe = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=7",
             "--trainer.callbacks.only_in=seed1", f"--trainer.callbacks.marker={tmp_path / 'sent'}",
             "--trainer.callbacks+=probes.FirstSteps"]  # fmt: skip
    command = ["multirun", "--seeds", "0-1", "--", *LIMIT, *QUIET, *probe]
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    with pytest.raises(SystemExit) as stop:
        main(command)
    assert stop.value.code == 143
    assert "--ckpt_path last" not in capsys.readouterr().err  # the multirun's own line says how it goes on
    root = Path("runs/multirun/multirun")
    with (root / "results.csv").open() as f:
        assert {int(r["n"]) for r in csv.DictReader(f)} == {1}  # seed0, finished before the stop
    (cut,) = root.glob("base/seed1/*")
    monkeypatch.setenv("SLURM_JOB_ID", "102")
    monkeypatch.delenv("KILN_RUN_DIR", raising=False)
    main(command)
    err = capsys.readouterr().err
    assert f"base/seed1: resuming the run a stop cut short ({cut}) from its last.ckpt" in err
    assert f"resuming from {cut / 'checkpoints' / 'last.ckpt'}" in err and "no checkpoint under" not in err
    assert list(root.glob("base/seed1/*")) == [cut] == [root / "base" / "seed1" / "job-101"]
    assert json.loads((cut / "metrics.json").read_text())["global_step"] == 10  # in its own folder, to the end
    assert (cut / "first_steps.txt").read_text().split() == ["0", "7"]  # resumed at the stop's step, not retrained
    with (root / "results.csv").open() as f:
        assert {int(r["n"]) for r in csv.DictReader(f)} == {2}
    monkeypatch.delenv("SLURM_JOB_ID")
    main(["predict", "--ckpt_path", str(cut / "checkpoints" / "last.ckpt"), *QUIET])  # beside the run: it went
    assert len(list(root.glob("base/seed1/predict-*/predictions.csv"))) == 1 and not Path("runs/base").exists()


@pytest.mark.slow
@pytest.mark.real_process  # a multirun's stop: no fork proof covers it
def test_a_stop_as_a_subprocess_run_ends_fitting_stops_the_command_and_the_rerun_tests_it(tmp_path: Path) -> None:
    """The command went on to the next run: the stop reached only the run that was ending."""
    probe = ["--trainer.callbacks+=probes.SignalAtFitEnd", "--trainer.callbacks.only_in=seed0",
             f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip
    command = [sys.executable, "-m", "kiln", "multirun", "--seeds", "0-1", "--subprocess", "--", *LIMIT, *QUIET, *probe]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    run = lambda: forkserver.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env,  # noqa: E731
                                 start_new_session=True)  # fmt: skip
    done = run()
    assert done.returncode == 143, done.stderr[-3000:]
    assert "base/seed0: interrupted; the same command resumes it" in done.stderr  # before its test after fit
    root = tmp_path / "runs" / "multirun" / "multirun"
    assert not (root / "base" / "seed1").exists()
    again = run()
    assert again.returncode == 0, again.stderr[-3000:]
    (seed0,) = (root / "base" / "seed0").iterdir()
    assert json.loads((seed0 / "metrics.json").read_text())["global_step"] == 10  # tested, not trained again
    with (root / "results.csv").open() as f:
        assert {int(r["n"]) for r in csv.DictReader(f)} == {2}


@pytest.mark.slow
def test_two_multiruns_on_one_folder_train_each_run_once_and_both_aggregate_all(tmp_path: Path) -> None:
    """Two multiruns on one folder (two machines on a shared disk) trained every run twice."""
    command = [sys.executable, "-m", "kiln", "multirun", "--seeds", "0-3", "--", *LIMIT, *QUIET]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    workers = forkserver.run_together([command] * 2, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors = [worker.stderr for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    root = tmp_path / "runs" / "multirun" / "multirun"
    trained = {seed: [p for p in (root / "base" / f"seed{seed}").iterdir() if p.is_dir()] for seed in range(4)}
    assert all(len(runs) == 1 for runs in trained.values()), trained  # once each, by one or the other
    with (root / "results.csv").open() as f:  # the one written last
        assert {int(r["n"]) for r in csv.DictReader(f)} == {4}
    for said in errors:  # each multirun's own table: every row over all four runs, its own and the other's
        counts = re.findall(r"^│ base +│.*│ +(\d+) │$", said, re.MULTILINE)
        assert counts and set(counts) == {"4"}, said[-2000:]
