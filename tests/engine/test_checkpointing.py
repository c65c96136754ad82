"""Checkpoint files: atomic writes, safe loading with clear errors, and `--ckpt_path last` across runs."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch
import yaml
from helpers import CONFIGS, LIMIT

from kiln.cli import build_cli
from kiln.commands.boundary import main
from kiln.files import written_whole
from kiln.training.checkpointing import AtomicCheckpointIO, CheckpointError, load_checkpoint_file

QUIET_LIMIT = [*LIMIT, "--trainer.logger", "false", "--run.test_after_fit", "false"]


def test_crash_mid_write_leaves_the_previous_checkpoint_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    io, target = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, target)

    def crash(obj: object, file: object, *args: object, **kwargs: object) -> None:
        file.write(b"PK\x03\x04 half a checkpoint")  # type: ignore[attr-defined]
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(3)}, target)
    monkeypatch.undo()
    assert load_checkpoint_file(target)["global_step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind


def test_two_writers_of_one_file_at_once_both_end_and_leave_it_whole(tmp_path: Path) -> None:
    """Three sweep drivers ending together each write the sweep's importance.png: with one temporary name for every
    writer, a driver's rename found its temporary moved away by another's (FileNotFoundError, an internal error)."""
    path = tmp_path / "importance.png"

    def other_writer() -> None:
        with written_whole(path) as partial:
            partial.write_text("theirs")

    with written_whole(path) as partial:
        partial.write_text("ours")
        other = threading.Thread(target=other_writer)  # another writer starts and ends inside this one's block
        other.start()
        other.join()
        assert path.read_text() == "theirs"
    assert path.read_text() == "ours" and [p.name for p in tmp_path.iterdir()] == ["importance.png"]


def test_training_writes_through_the_atomic_io() -> None:
    cli = build_cli(["fit", *QUIET_LIMIT])
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    checkpoints = Path(cli.trainer.default_root_dir) / "checkpoints"
    assert (checkpoints / "last.ckpt").is_file() and not list(checkpoints.glob(".*.tmp"))
    umask = os.umask(0)
    os.umask(umask)
    assert (checkpoints / "last.ckpt").stat().st_mode & 0o777 == 0o666 & ~umask  # as any file written here


@pytest.mark.slow
def test_last_ckpt_is_always_the_newest_state_never_versioned_and_a_finished_rerun_does_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # mode max on a falling loss: only epoch 0 is a top-k file; Lightning's save_last kept last.ckpt there
    config = yaml.safe_load((CONFIGS / "train.yaml").read_text())
    config["trainer"]["callbacks"][0]["init_args"]["mode"] = "max"
    (tmp_path / "max.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": config["trainer"]["callbacks"]}}))
    stale_prone = [*QUIET_LIMIT, "--ckpt_path", "last", "-c", str(tmp_path / "max.yaml")]
    first = build_cli(["fit", *stale_prone, "--trainer.max_epochs", "1"])
    checkpoints = Path(first.trainer.default_root_dir) / "checkpoints"
    build_cli(["fit", *stale_prone, "--trainer.max_epochs", "3"])  # resumed from the first run's last.ckpt
    assert [p.name for p in checkpoints.glob("last*")] == ["last.ckpt"]  # never last-v1.ckpt
    assert load_checkpoint_file(checkpoints / "last.ckpt")["global_step"] == 3 * 5  # not the best file's 5
    before = (checkpoints / "last.ckpt").stat().st_mtime_ns
    capsys.readouterr()
    main(["fit", *stale_prone, "--trainer.max_epochs", "3"])  # the same command again: exit 0, nothing done
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"{checkpoints.parent} is complete (training finished at epoch 3, step 15): nothing to do. "
        "Raise --trainer.max_epochs or --trainer.max_steps to train on, or drop --ckpt_path for a new run"
    ]
    assert (checkpoints / "last.ckpt").stat().st_mtime_ns == before


@pytest.mark.slow
def test_killed_write_leftovers_are_removed_on_the_next_start_in_that_folder(capsys: pytest.CaptureFixture) -> None:
    first = build_cli(["fit", *QUIET_LIMIT, "--ckpt_path", "last", "--trainer.max_epochs", "1"])
    checkpoints = Path(first.trainer.default_root_dir) / "checkpoints"
    leftover = checkpoints / ".last.ckpt.k1ll3d.tmp"  # what a kill -9 mid-write leaves
    leftover.write_bytes((checkpoints / "last.ckpt").read_bytes())
    build_cli(["fit", *QUIET_LIMIT, "--ckpt_path", "last"])
    assert not leftover.exists()
    assert f"removed {leftover}, left by a checkpoint write that was killed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist"),
        (b"", "truncated, corrupted or not a checkpoint"),
        (b"not a checkpoint at all", "truncated, corrupted or not a checkpoint"),
    ],
    ids=["missing", "empty", "text"],
)
def test_unreadable_checkpoint_is_a_one_line_error_naming_the_file(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    path = tmp_path / "broken.ckpt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint_file(path)
    assert str(path) in str(err.value) and says in str(err.value) and "\n" not in str(err.value)


def test_truncated_checkpoint_via_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cli = build_cli(["fit", *QUIET_LIMIT])
    good = Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *QUIET_LIMIT, "--ckpt_path", str(truncated)])
    assert exit_info.value.code == 1
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert str(truncated) in line and "truncated, corrupted or not a checkpoint" in line


def test_pickled_objects_are_refused_not_loaded_unsafely(tmp_path: Path) -> None:
    path = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "callback": _Unsafe()}, path)
    with pytest.raises(CheckpointError, match="objects the safe loader refuses"):
        load_checkpoint_file(path)


class _Unsafe:
    pass


def test_ckpt_path_last_finds_the_newest_run_and_continues_in_its_folder(capsys: pytest.CaptureFixture) -> None:
    fresh = build_cli(["fit", *QUIET_LIMIT, "--ckpt_path", "last"])
    assert "no checkpoint under" in capsys.readouterr().err  # said, not silent
    first_dir = Path(fresh.trainer.default_root_dir)
    longer = build_cli(["fit", *QUIET_LIMIT, "--ckpt_path", "last", "--trainer.max_epochs", "3"])
    assert f"resuming from {first_dir / 'checkpoints' / 'last.ckpt'}" in capsys.readouterr().err
    assert Path(longer.trainer.default_root_dir) == first_dir  # continued in place
    assert longer.trainer.global_step == 3 * 5 and longer.trainer.current_epoch == 3


@pytest.mark.slow
def test_a_run_its_time_limit_stopped_trains_on_only_when_the_limit_is_raised(capsys: pytest.CaptureFixture) -> None:
    """Lightning's Timer counts the time trained before a resume: with the same --trainer.max_time a longer resume
    trained nothing, tested again and exited 0, after advice to raise max_epochs."""
    args = ["fit", "--trainer.logger", "false", "--run.test_after_fit", "false", "--ckpt_path", "last",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]  # fmt: skip
    first = build_cli([*args, "--trainer.max_time", "00:00:00:01"])  # 30 epochs: the time limit stops it
    steps, last = first.trainer.global_step, Path(first.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    assert 0 < steps < 30 * 23
    capsys.readouterr()
    main([*args, "--trainer.max_time", "00:00:00:01", "--trainer.max_epochs", "40"])
    err = capsys.readouterr().err
    assert f"training stopped at its time limit, --trainer.max_time 1 s, at epoch {first.trainer.current_epoch}" in err
    assert "nothing to do. Raise --trainer.max_time to train on" in err
    assert load_checkpoint_file(last)["global_step"] == steps
    longer = build_cli([*args, "--trainer.max_time", "00:00:00:02"])
    assert longer.trainer.global_step > steps


@pytest.mark.slow
def test_a_finished_run_whose_test_never_completed_is_tested_not_retrained(capsys: pytest.CaptureFixture) -> None:
    args = ["fit", *LIMIT, "--trainer.logger", "false", "--ckpt_path", "last"]
    first = build_cli(args)
    run_dir = Path(first.trainer.default_root_dir)
    first_metrics = (run_dir / "metrics.json").read_text()
    capsys.readouterr()
    main(args)
    assert "training finished at epoch 2, step 10; tested): nothing to do" in capsys.readouterr().err
    (run_dir / "metrics.json").unlink()  # as if the test after fit had been stopped
    saved = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "checkpoints").iterdir()}
    again = build_cli(args)
    assert again.test_metrics is not None and (run_dir / "metrics.json").is_file()
    # nothing trained: a retrain (from scratch, too) writes every checkpoint anew, and would test its own weights
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "checkpoints").iterdir()} == saved
    tested = json.loads((run_dir / "metrics.json").read_text())["test"]
    assert [t["metrics"] for t in tested] == [t["metrics"] for t in json.loads(first_metrics)["test"]]


@pytest.mark.parametrize(
    ("given", "says"), [("", "an empty checkpoint path"), ("run", "is a folder, not a file (a run folder")]
)
def test_an_empty_path_or_a_folder_as_checkpoint_is_named_as_such(
    given: str, says: str, capsys: pytest.CaptureFixture
) -> None:
    """`--ckpt_path ""` said "checkpoint . does not exist", and a folder "does not exist"."""
    Path("run", "checkpoints").mkdir(parents=True)
    with pytest.raises(SystemExit) as stop:
        main(["test", "--ckpt_path", given, "--trainer.logger", "false"])
    assert stop.value.code != 0
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert says in line
