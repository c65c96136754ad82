"""Data larger than memory: converted to LitData chunks once, streamed, sharded and resumed exactly."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import forkserver
import pytest
import torch
from helpers import CONFIGS, LIMIT, PROBES, needs
from test_resume import assert_bitwise_equal, final_state

from kiln.cli import build_cli
from kiln.data import StreamingDataModule
from kiln.data.streaming import convert
from kiln.errors import DataError
from research.data import FriedmanDataModule, SentencesDataModule, WaveformsDataModule

needs("litdata", reason="needs the data extra (make install; uv sync --extra data)")

WAVEFORMS = ["-c", str(CONFIGS / "experiment" / "waveforms.yaml")]
CONVERT = [sys.executable, "-m", "kiln", "convert"]
DETERMINISTIC = ["-c", str(CONFIGS / "trainer" / "deterministic.yaml")]
DDP = ["-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml")]


def streamed(root: Path) -> list[str]:
    return ["-c", str(CONFIGS / "data" / "streaming.yaml"), "--data.init_args.root", str(root),
            "--trainer.logger", "false"]  # fmt: skip


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 waveforms written as LitData chunks by kiln's converter."""
    root = tmp_path_factory.mktemp("streamed")
    data = WaveformsDataModule(num_samples=300, num_workers=0, mean=(0.25,), std=(2.0,))  # statistics kiln.json keeps
    return convert(data, root / "waveforms", chunk_bytes="16KB")


@pytest.mark.slow
def test_converted_chunks_declare_the_data_and_train(chunks: Path) -> None:
    meta = json.loads((chunks / "kiln.json").read_text())
    assert meta["num_classes"] == 4 and meta["input_shape"] == [1, 64] and meta["class_names"][0] == "sine"
    cli = build_cli(["fit", *WAVEFORMS, *streamed(chunks), *LIMIT, "--data.init_args.num_workers", "0"])
    assert isinstance(cli.datamodule, StreamingDataModule) and cli.model.num_classes == 4
    assert meta["mean"] == [0.25] and cli.datamodule.mean == (0.25,) and cli.datamodule.std == (2.0,)  # kiln.json's
    assert cli.trainer.state.finished and "test/acc" in (cli.test_metrics or {})
    sizes = [len(cli.datamodule.train_set), len(cli.datamodule.test_set)]  # type: ignore[arg-type]
    assert sizes == [210, 60]  # the converted splits


@pytest.mark.slow
def test_the_documented_convert_command_writes_chunks_of_a_folder_config(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [*CONVERT, *WAVEFORMS, "--data.init_args.num_samples", "100", "--output", str(out)]
    done = forkserver.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"wrote {out} (train, val, test; kiln.json)"
    assert all((out / split / "index.json").is_file() for split in ("train", "val", "test"))
    missing = forkserver.run([*CONVERT, "--output", "x"], capture_output=True, text=True)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2], ids=["workers0", "workers2"])
def test_a_mid_epoch_resume_of_streamed_data_is_bitwise_the_uninterrupted_run(
    chunks: Path, workers: int, tmp_path: Path
) -> None:
    augment = tmp_path / "augment.yaml"  # a random per-sample augmentation, seeded by (seed, epoch, sample)
    augment.write_text("data:\n  init_args:\n    train_transforms:\n      - class_path: torch.nn.Dropout\n"
                       "        init_args: {p: 0.1}\n")  # fmt: skip
    args = ["fit", *WAVEFORMS, *streamed(chunks), "-c", str(augment), *DETERMINISTIC,
            "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2",
            "--data.init_args.num_workers", str(workers), "--data.init_args.batch_size", "16",
            "--model.init_args.net.init_args.dropout", "0.3", "--run.test_after_fit", "false",
            "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=4",
            "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename=mid-{step}"]  # fmt: skip
    whole = build_cli([*args, "--run.root", str(tmp_path / "whole")])
    run_dir = Path(whole.trainer.default_root_dir)
    ckpt = run_dir / "checkpoints" / "mid-step=8.ckpt"
    assert torch.load(ckpt, weights_only=True)["global_step"] == 8  # epoch 1, batch 2 of 6
    resumed = build_cli([*args, "--run.root", str(tmp_path / "resumed"), "--ckpt_path", str(ckpt)])
    assert_bitwise_equal(final_state(resumed.trainer.default_root_dir), final_state(str(run_dir)))


@pytest.mark.slow
def test_ddp_ranks_read_disjoint_shards(chunks: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "kiln", "fit", *WAVEFORMS, *streamed(chunks), *DDP, "--trainer.max_epochs", "1",
           "--trainer.limit_val_batches", "1", "--run.test_after_fit", "false", "--data.init_args.num_workers", "0",
           "--data.init_args.batch_size", "16", "--run.root", str(tmp_path / "runs"),
           "--trainer.callbacks+=probes.RecordInputs", f"--trainer.callbacks.folder={tmp_path}"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    done = forkserver.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"inputs-rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] and ranks[1] and not set(ranks[0]) & set(ranks[1])  # each sample on one rank only
    # equal shares in whole batches (LitData drops the remainder under DDP): 2 x 6 x 16 of the 210
    assert len(ranks[0]) == len(ranks[1]) == 96


def test_a_folder_without_kiln_json_names_the_command_that_writes_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no kiln.json at .*; write it with `kiln convert`"):
        StreamingDataModule(root=str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("source", ["regression", "language_model"])
def test_streamed_data_of_any_task_keeps_its_samples_targets_and_declarations(source: str, tmp_path: Path) -> None:
    """Streaming took every task for image classification: a regression's real targets were cut to integers
    (``int(y)``), ``num_classes`` was required (an internal error without it), and ``num_outputs``,
    ``vocab_size`` and ``block_size`` were not carried, so the linked network was built for 10 outputs."""
    data = (FriedmanDataModule(num_samples=200, num_workers=0) if source == "regression" else
            SentencesDataModule(num_sentences=60, block_size=16, num_workers=0))  # fmt: skip
    data.setup("fit")
    streamed_data = StreamingDataModule(root=str(convert(data, tmp_path / source, chunk_bytes="16KB")), num_workers=0)
    for name in ("num_classes", "num_outputs", "vocab_size", "block_size", "input_shape", "mean", "std"):
        assert getattr(streamed_data, name, None) == getattr(data, name, None), name
    streamed_data.setup("fit")
    x, y = next(iter(streamed_data.val_dataloader()))  # validation: not shuffled, not augmented
    expected_x, expected_y = next(iter(data.val_dataloader()))
    assert x.dtype == expected_x.dtype and y.dtype == expected_y.dtype  # float features, int64 token ids and targets
    assert torch.equal(y, expected_y) and torch.allclose(x, expected_x)  # targets not rounded, ids not normalised
