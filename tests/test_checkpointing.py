"""Checkpoint files: atomic writes, safe loading with clear errors, and `--ckpt_path last` across runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import LIMIT

from kiln.checkpointing import AtomicCheckpointIO, CheckpointError, load_checkpoint_file
from kiln.cli import build_cli, main

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


def test_training_writes_through_the_atomic_io() -> None:
    cli = build_cli(["fit", *QUIET_LIMIT])
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    checkpoints = Path(cli.trainer.default_root_dir) / "checkpoints"
    assert (checkpoints / "last.ckpt").is_file() and not list(checkpoints.glob(".*.tmp"))
    best, last = Path(cli.trainer.checkpoint_callback.best_model_path), checkpoints / "last.ckpt"  # type: ignore[union-attr]
    same_step = load_checkpoint_file(best)["global_step"] == load_checkpoint_file(last)["global_step"]
    assert os.path.samefile(best, last) == same_step  # written once when both hold the same step


def test_a_second_save_of_the_same_state_links_the_first_and_training_in_between_writes_anew(tmp_path: Path) -> None:
    io, net = AtomicCheckpointIO(), torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)

    def checkpoint() -> dict:  # the step number stays 7 throughout: only the tensors tell the states apart
        return {"global_step": 7, "state_dict": net.state_dict(), "optimizer_states": [optimizer.state_dict()]}

    def train_step() -> None:
        net(torch.randn(4, 3)).square().sum().backward()
        optimizer.step()

    train_step()
    io.save_checkpoint(checkpoint(), tmp_path / "best.ckpt")
    io.save_checkpoint(checkpoint(), tmp_path / "last.ckpt")
    assert os.path.samefile(tmp_path / "best.ckpt", tmp_path / "last.ckpt")
    (tmp_path / "best.ckpt").unlink()
    io.save_checkpoint(checkpoint(), tmp_path / "best.ckpt")  # the same state again: written, as it is gone
    assert load_checkpoint_file(tmp_path / "best.ckpt")["global_step"] == 7
    best_weight = net.weight.detach().clone()
    train_step()
    io.save_checkpoint(checkpoint(), tmp_path / "last.ckpt")
    assert not os.path.samefile(tmp_path / "best.ckpt", tmp_path / "last.ckpt")
    assert torch.equal(load_checkpoint_file(tmp_path / "best.ckpt")["state_dict"]["weight"], best_weight)
    assert torch.equal(load_checkpoint_file(tmp_path / "last.ckpt")["state_dict"]["weight"], net.weight.detach())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "last.ckpt").stat().st_mode & 0o777 == 0o666 & ~umask  # as any file written here


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
