"""Faults users and clusters deliver: each ends in one clear line, a kept run, or a correct resume."""

from __future__ import annotations

import fcntl
import json
import math
import multiprocessing
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import pytest
import torch
from dataset_files import write_image_folder
from helpers import CONFIGS, LIMIT, PROBES

from kiln.cli import build_cli
from kiln.commands.boundary import main
from kiln.runs.record import RunRecord
from kiln.training.checkpointing import load_checkpoint_file
from kiln.training.schedules import WarmupCosineLR

QUIET = [*LIMIT, "--trainer.logger", "false", "--run.test_after_fit", "false"]


def error_lines(capsys: pytest.CaptureFixture) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def exit_code(args: list[str]) -> int | str | None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code


@pytest.mark.parametrize("mode", ["host", "device"], ids=["immediate", "deferred_on_device"])
def test_a_skipped_step_leaves_batchnorm_statistics_as_before_it(tmp_path: Path, mode: str) -> None:
    net = tmp_path / "nan_input.yaml"
    net.write_text(
        "model:\n  init_args:\n    net:\n      class_path: faulty.NaNInputAtStep\n"
        "      init_args: {step: 3, in_channels: 1, num_classes: 10}\n"
    )
    skip = ["-c", str(CONFIGS / "callbacks" / "skip_nonfinite.yaml"), "--non_finite.mode", mode]
    cli = build_cli(["fit", *LIMIT, "--trainer.logger", "false", "-c", str(net), *skip])
    assert cli.test_metrics is not None and math.isfinite(cli.test_metrics["test/loss"])  # NaN statistics: NaN
    checkpoints = list((Path(cli.trainer.default_root_dir) / "checkpoints").glob("*.ckpt"))
    assert checkpoints
    for path in checkpoints:
        for name, tensor in torch.load(path, weights_only=True, map_location="cpu")["state_dict"].items():
            assert torch.isfinite(tensor.float()).all(), f"{path.name}: {name}"


def test_a_label_out_of_range_after_the_first_batch_is_one_line_naming_batch_and_sample(
    capsys: pytest.CaptureFixture,
) -> None:
    data = ["--data", "faulty.LabelsOutOfRange", "--trainer.callbacks", "[]"]  # no BatchSanityCheck to catch it
    assert exit_code(["fit", *QUIET, *data]) == 1
    (line,) = error_lines(capsys)
    assert "train batch 0 of epoch 0: label 10 of sample" in line and "outside [0, 10)" in line


@pytest.mark.parametrize(
    ("fractions", "says"),
    [("train", "the training set is empty"), ("val", "the validation set is empty")],
)
def test_an_empty_split_stops_in_one_line_and_leaves_no_run_folder(
    capsys: pytest.CaptureFixture, fractions: str, says: str
) -> None:
    data = ["--data", "faulty.EmptySplit", "--data.empty", fractions]
    assert exit_code(["fit", *QUIET, *data]) == 1
    (line,) = error_lines(capsys)
    assert says in line
    assert not list(Path("runs/digits").glob("*"))  # failed before its first checkpoint: nothing left


def test_enable_progress_bar_false_is_honoured() -> None:
    cli = build_cli(
        ["fit", *QUIET, "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    )
    assert cli.trainer.progress_bar_callback is None and cli.trainer.global_step == 10


def test_a_run_failing_before_its_first_checkpoint_leaves_no_folder(capsys: pytest.CaptureFixture) -> None:
    assert exit_code(["fit", *QUIET, "--data", "faulty.LabelsOutOfRange"]) == 1  # BatchSanityCheck: batch 0
    err = capsys.readouterr().err
    assert "removed " in err and "failed before it saved anything there" in err
    assert not list(Path("runs/digits").glob("*"))


def test_a_failed_command_never_removes_an_earlier_commands_folder(capsys: pytest.CaptureFixture) -> None:
    build_cli([*QUIET], run=False)  # a folder that holds no checkpoint (a notebook's earlier cell)
    (tested,) = Path("runs/digits").iterdir()
    assert exit_code(["fit", "--trainer.max_epoch", "1"]) == 2  # fails before it has a folder of its own
    assert tested.is_dir() and "removed" not in capsys.readouterr().err


def test_ckpt_path_last_on_a_corrupt_file_is_one_line(capsys: pytest.CaptureFixture) -> None:
    first = build_cli(["fit", *QUIET, "--ckpt_path", "last"])
    last = Path(first.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    capsys.readouterr()
    assert exit_code(["fit", *QUIET, "--ckpt_path", "last"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: checkpoint {last} is truncated, corrupted or not a checkpoint (UnpicklingError)"] or (
        len(err) == 1 and str(last) in err[0] and "truncated, corrupted" in err[0]
    )


@pytest.mark.slow
def test_a_slurm_job_resumes_only_its_own_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    build_cli(["fit", *QUIET, "--ckpt_path", "last"])
    monkeypatch.setenv("SLURM_JOB_ID", "102")  # another job: another seed, say
    monkeypatch.delenv("KILN_RUN_DIR", raising=False)
    capsys.readouterr()
    second = build_cli(["fit", *QUIET, "--ckpt_path", "last", "--seed_everything", "7"])
    assert "no checkpoint under" in capsys.readouterr().err
    assert Path(second.trainer.default_root_dir).name == "job-102" and second.trainer.global_step == 10


def _claim(root: str, start: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue) -> None:
    start.wait()
    out.put(str(RunRecord().open(root, "race")))


def test_runs_started_at_the_same_instant_never_share_a_folder(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    n = 8
    start, out = context.Barrier(n), context.Queue()
    processes = [context.Process(target=_claim, args=(str(tmp_path), start, out)) for _ in range(n)]
    for process in processes:
        process.start()
    folders = [out.get(timeout=60) for _ in processes]
    for process in processes:
        process.join()
    assert len(set(folders)) == n


@pytest.mark.slow
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "true"]).returncode:
        pytest.skip("needs unshare to mount a small filesystem")
    runs = tmp_path / "small"
    runs.mkdir()
    # a 2 MiB filesystem: room for config, pictures and two ~0.7 MB checkpoints, not for the next write
    kiln = [sys.executable, "-m", "kiln", "fit", *QUIET, "--run.root", str(runs), "--trainer.max_epochs", "3"]
    mount = f"mount -t tmpfs -o size=2m tmpfs {runs}"
    left = tmp_path / "left"  # what the small filesystem holds after the run, copied out before it goes
    script = f"{mount} && {shlex.join(kiln)}; rc=$?; cp -r {runs} {left}; exit $rc"
    env = {**os.environ, "PYTHONPATH": PROBES}
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert errors[0].startswith("error: no space left on device while writing ") and "intact" in errors[0]
    kept = sorted(left.glob("digits/*/checkpoints/*"))
    assert kept and all(path.suffix == ".ckpt" for path in kept)  # no temporary file left
    assert all(load_checkpoint_file(path)["global_step"] > 0 for path in kept)  # each loadable
    assert any(path.name == "last.ckpt" for path in kept)


def test_a_resume_that_changes_the_model_is_refused_in_one_line(capsys: pytest.CaptureFixture) -> None:
    first = build_cli(["fit", *QUIET, "--ckpt_path", "last", "--trainer.max_epochs", "1"])
    capsys.readouterr()
    assert exit_code(["fit", *QUIET, "--ckpt_path", "last", "--model.init_args.net.init_args.width", "16"]) == 1
    (line,) = error_lines(capsys)
    assert line.startswith("error: model.init_args.net.init_args.width: the checkpoint ")
    assert "was trained with 32, this command gives 16" in line
    assert load_checkpoint_file(Path(first.trainer.default_root_dir) / "checkpoints" / "last.ckpt")["global_step"] == 5


@pytest.mark.slow
def test_a_resume_onto_other_data_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first = build_cli(["fit", *QUIET, "--ckpt_path", "last", "--trainer.max_epochs", "1"])  # digits
    write_image_folder(tmp_path / "images", classes=10, per_class=8)  # 10 classes of 8x8 grey images: same shape
    folder = ["--data", "kiln.data.FolderDataModule", "--data.root", str(tmp_path / "images"), "--data.image_size",
              "8", "--data.channels", "1", "--data.num_workers", "0",
              "--run.name", "digits"]  # fmt: skip  # unset, its runs would be runs/folder's: no digits checkpoint there
    config = Path(first.trainer.default_root_dir) / "config.yaml"
    before = config.read_text()
    capsys.readouterr()
    assert exit_code(["fit", *QUIET, "--ckpt_path", "last", "--trainer.max_epochs", "2", *folder]) == 1
    (line,) = error_lines(capsys)
    assert "data: the checkpoint" in line and "trained on research.data.DigitsDataModule, this command gives " in line
    assert exit_code(["fit", *QUIET, "--ckpt_path", "last", "--trainer.max_epochs", "2", "--data.split_seed", "7"]) == 1
    (line,) = error_lines(capsys)
    assert line.startswith("error: data.init_args.split_seed: the checkpoint ")
    assert "with 0, this command gives 7" in line
    # another seed: the order and augmentation of the epochs left would follow it, and config.yaml name it alone
    assert exit_code(["fit", *QUIET, "--ckpt_path", "last", "--trainer.max_epochs", "2", "--seed_everything", "7"]) == 1
    (line,) = error_lines(capsys)
    assert line.startswith("error: seed_everything: the run of ") and "trained with 42, this command gives 7" in line
    assert config.read_text() == before  # the run is as it was
    resumed = build_cli(["fit", *QUIET, "--ckpt_path", "last", "--trainer.max_epochs", "2", "--data.batch_size", "32",
                         "--seed_everything", "true"])  # fmt: skip
    assert resumed.trainer.current_epoch == 2  # another batch size is the same data: resumed
    assert resumed.config.fit.seed_everything == 42  # any seed: the run's


@pytest.mark.slow
def test_a_resume_with_more_epochs_stretches_the_schedule_instead_of_training_at_lr_0() -> None:
    build_cli(["fit", *QUIET, "--ckpt_path", "last", "--trainer.max_epochs", "1"])
    longer = build_cli(["fit", *QUIET, "--ckpt_path", "last", "--trainer.max_epochs", "3"])
    scheduler = longer.trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(scheduler, WarmupCosineLR)
    assert scheduler.total_steps == 15  # the restored state said 5: steps 5-14 would have run at lr 0
    assert 0 < scheduler.factor(7) < 1


@pytest.mark.slow
@pytest.mark.parametrize("command", ["test", "predict"])
def test_a_full_disk_while_testing_or_predicting_is_one_line_and_leaves_nothing_half_written(
    command: str, tmp_path: Path
) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "true"]).returncode:
        pytest.skip("needs unshare to mount a small filesystem")
    fit = build_cli(["fit", *QUIET, "--run.root", str(tmp_path / "runs")])
    last = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    small = tmp_path / "small"  # 16 KiB: room for config.yaml, not for the confusion matrix or predictions.csv
    small.mkdir()
    kiln = [sys.executable, "-m", "kiln", command, "--ckpt_path", str(last), "--run.root", str(small),
            "--trainer.logger", "false"]  # fmt: skip
    left = f"find {small} -type f -printf 'left %p\\n'"
    script = f"mount -t tmpfs -o size=16k tmpfs {small} && {shlex.join(kiln)}; rc=$?; {left}; exit $rc"
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: no space left on the device: free some, or write elsewhere (--run.root, --output)"]
    assert "Traceback" not in done.stderr and "left " not in done.stdout  # no file left: a 0-byte PNG was, before


@pytest.mark.slow
def test_a_full_disk_under_w_and_b_stops_w_and_b_in_one_line_and_the_run_goes_on(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "true"]).returncode:
        pytest.skip("needs unshare to mount a small filesystem")
    small = tmp_path / "wandb-disk"  # 16 KiB for W&B's files; the run folder on the ordinary disk
    small.mkdir()
    kiln = [sys.executable, "-m", "kiln", "fit", *LIMIT, "--trainer.enable_progress_bar", "false",
            "--trainer.logger.init_args.save_dir", str(small), "--run.root", str(tmp_path / "runs")]  # fmt: skip
    script = f"mount -t tmpfs -o size=16k tmpfs {small} && {shlex.join(kiln)}"
    env = {**os.environ, "WANDB_MODE": "offline"}
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]  # was exit 1 with 45,954 lines, 988 of them logging errors
    assert done.stderr.count("W&B: logging stopped (") == 1 and "Logging error" not in done.stderr
    assert len(done.stderr.splitlines()) < 100
    (run,) = (tmp_path / "runs" / "digits").iterdir()
    assert "test" in json.loads((run / "metrics.json").read_text())  # the test after fit ran and was recorded


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_evaluating_without_a_checkpoint_is_refused_in_one_line(command: str, capsys: pytest.CaptureFixture) -> None:
    """It scored the untrained network and said finished (test/acc 0.0919, exit 0)."""
    assert exit_code([command, *QUIET]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: kiln {command}: no --ckpt_path, so it would score an untrained network")
    assert not Path("runs").exists()  # no run folder
    assert exit_code([command, *QUIET, "--ckpt_path", "last"]) == 2  # and `last` that finds none says so
    assert "--ckpt_path last: no checkpoint under" in capsys.readouterr().err


def test_an_endless_run_with_a_schedule_of_its_length_is_one_line(capsys: pytest.CaptureFixture) -> None:
    """--trainer.max_epochs -1 was an internal error (OverflowError: cannot convert float infinity to integer)."""
    assert exit_code(["fit", *QUIET, "--trainer.max_epochs", "-1"]) == 1
    (line,) = error_lines(capsys)
    assert "WarmupCosineLR takes its length from the run, which has no end" in line


@pytest.mark.slow
def test_a_second_command_on_a_run_folder_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    """Two `kiln fit --ckpt_path last` on one run both trained it to the end (best-…-v1.ckpt, two summaries)."""
    root = tmp_path / "runs"
    first = subprocess.Popen([sys.executable, "-m", "kiln", "fit", "--trainer.max_epochs", "200", "--trainer.logger",
                              "false", "--run.root", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        for _ in range(600):  # until its first epoch's last.ckpt exists
            if list(root.glob("digits/*/checkpoints/last.ckpt")) or first.poll() is not None:
                break
            time.sleep(0.1)
        (last,) = root.glob("digits/*/checkpoints/last.ckpt")
        again = [sys.executable, "-m", "kiln", "fit", "--ckpt_path", "last", "--trainer.logger", "false",
                 "--run.root", str(root)]  # fmt: skip
        second = forkserver.run(again, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert errors == [f"error: {last.parent.parent} is in use by another command (process {first.pid}): wait "
                          "for it to end, or stop it first"]  # fmt: skip
        assert first.poll() is None  # the first goes on
    finally:
        first.kill()
        first.wait()


def test_a_command_that_ended_in_a_python_session_leaves_its_run_folder_free() -> None:
    """A notebook's finished fit held its run folder until the next command or the kernel's end: a `kiln fit
    --ckpt_path last` from a terminal was refused as "in use" (and the lock's file was left open)."""
    cli = build_cli(["fit", *LIMIT, "--run.test_after_fit", "false", "--trainer.logger", "false"])
    with (Path(cli.trainer.default_root_dir) / ".lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while the ended command holds it
