"""Never lose a run: a resumed run ends bitwise where the uninterrupted one does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import pytest
import torch
from dataset_files import write_image_folder
from helpers import CONFIGS, LIMIT, PROBES

from kiln import results
from kiln.cli import build_cli


def run_args(workers: int | str) -> list[str]:
    """Shuffling, dropout and augmentation all on; checkpoints every 4 steps (mid-epoch) and every epoch.

    ``workers``: DataLoader worker processes, or ``"on_device"`` for the on-device data path.
    """
    on_device = ["--data.on_device", "true"] if workers == "on_device" else []
    workers = 0 if workers == "on_device" else workers
    return [
        "fit", *on_device, "-c", str(CONFIGS / "trainer" / "deterministic.yaml"),
        "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2",
        "--data.num_workers", str(workers), "--data.batch_size", "32",
        "--model.init_args.net.init_args.dropout", "0.3",
        "--trainer.logger", "false", "--run.test_after_fit", "false",
        "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=4",
        "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename=mid-{step}",
        "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_epochs=1",
        "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename=end-{epoch}",
    ]  # fmt: skip


def final_state(run_dir: str) -> dict:
    return torch.load(Path(run_dir) / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")


def assert_bitwise_equal(a: dict, b: dict, steps: int = 18) -> None:
    assert a["global_step"] == b["global_step"] == steps
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for group_a, group_b in zip(a["optimizer_states"], b["optimizer_states"], strict=True):
        for param, state in group_a["state"].items():
            for name, value in state.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(group_b["state"][param][name])), name
    assert a["lr_schedulers"] == b["lr_schedulers"]


@pytest.fixture(scope="module", params=[0, 2, "on_device"], ids=["workers0", "workers2", "on_device"])
def uninterrupted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int | str, Path]:
    root = tmp_path_factory.mktemp(f"runs{request.param}")
    cli = build_cli([*run_args(request.param), "--run.root", str(root)])
    return request.param, Path(cli.trainer.default_root_dir)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["mid-step=8.ckpt", "end-epoch=1.ckpt"], ids=["mid_epoch", "epoch_end"])
def test_resume_reproduces_the_uninterrupted_run(
    uninterrupted: tuple[int | str, Path], checkpoint: str, tmp_path: Path
) -> None:
    workers, run_dir = uninterrupted
    ckpt = run_dir / "checkpoints" / checkpoint
    saved = torch.load(ckpt, weights_only=True, map_location="cpu")
    assert saved["global_step"] in (8, 12)  # epoch 1, batch 2 of 6; end of epoch 1
    resumed = build_cli([*run_args(workers), "--run.root", str(tmp_path), "--ckpt_path", str(ckpt)])
    assert_bitwise_equal(final_state(resumed.trainer.default_root_dir), final_state(str(run_dir)))


@pytest.fixture(scope="module", params=[0, 2], ids=["workers0", "workers2"])
def folder_uninterrupted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    """The same run on 300 digits read as PNG files, augmented per sample by a seeded RandomAffine."""
    root = tmp_path_factory.mktemp(f"folder{request.param}")
    write_image_folder(root / "images", classes=10, per_class=30)
    config = root / "folder.yaml"
    config.write_text(
        f"data:\n  class_path: kiln.data.FolderDataModule\n  init_args:\n    root: {root / 'images'}\n"
        "    image_size: 8\n    channels: 1\n    train_transforms:\n"
        "      - class_path: torchvision.transforms.v2.RandomAffine\n"
        "        init_args: {degrees: 10, translate: [0.125, 0.125]}\n"
    )
    args = ["fit", "-c", str(config), *run_args(request.param)[1:]]
    cli = build_cli([*args, "--run.root", str(root / "runs")])
    return args, Path(cli.trainer.default_root_dir)


@pytest.mark.slow
def test_resume_from_image_files_reproduces_the_uninterrupted_run(
    folder_uninterrupted: tuple[list, Path], tmp_path: Path
) -> None:
    args, run_dir = folder_uninterrupted
    ckpt = run_dir / "checkpoints" / "mid-step=8.ckpt"
    resumed = build_cli([*args, "--run.root", str(tmp_path), "--ckpt_path", str(ckpt)])
    assert_bitwise_equal(final_state(resumed.trainer.default_root_dir), final_state(str(run_dir)))


def signal_command(workers: int) -> list[str]:
    """The job a signal stops: the same command runs again after the stop (SLURM's requeue)."""
    return [
        sys.executable,
        "-m",
        "kiln",
        *run_args(workers)[:-8],
        "--ckpt_path",
        "last",
        "--trainer.logger",
        "WandbLogger",
    ]


SLURM_JOB = {"WANDB_MODE": "offline", "SLURM_JOB_ID": "777"}


@pytest.fixture(scope="module")
def uninterrupted_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of the job never stopped, without workers: every signal test compares with it."""
    root = tmp_path_factory.mktemp("uninterrupted")
    done = forkserver.run([*signal_command(0), "--run.root", str(root)], capture_output=True, text=True,
                          env={**os.environ, **SLURM_JOB}, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "digits" / "job-777"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "code", "group"),
    [
        ("SIGTERM", 143, False),
        ("SIGUSR1", 138, False),
        pytest.param("SIGTERM", 143, True, marks=pytest.mark.real_process),
    ],  # workers: no fork proof covers them
    ids=["SIGTERM", "SIGUSR1", "SIGTERM_to_the_process_group_with_workers"],
)
def test_signal_saves_and_the_same_command_resumes_exactly(
    tmp_path: Path, name: str, code: int, group: bool, uninterrupted_job: Path
) -> None:
    scontrol = tmp_path / "bin" / "scontrol"  # records what a SLURM requeue would do
    scontrol.parent.mkdir()
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    scontrol.chmod(0o755)
    env = {**os.environ, **SLURM_JOB, "PYTHONPATH": PROBES,
           "PATH": f"{scontrol.parent}:{os.environ['PATH']}"}  # fmt: skip
    base = signal_command(2 if group else 0)  # a group signal reaches the DataLoader workers too

    def launch(root: Path, *extra: str) -> subprocess.CompletedProcess:
        cmd = [*base, "--run.root", str(root), *extra]  # its own process group, as a batch job has
        return forkserver.run(cmd, capture_output=True, text=True, env=env, timeout=300, start_new_session=True)

    probe = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=8",
             f"--trainer.callbacks.marker={tmp_path / 'sent'}", f"--trainer.callbacks.name={name}",
             f"--trainer.callbacks.group={group}"]  # fmt: skip
    first = launch(tmp_path / "runs", *probe)
    assert first.returncode == code, first.stderr[-2000:]
    assert "no checkpoint under" in first.stderr and f"{name}: stopped after step 8" in first.stderr
    assert "killed by signal" not in first.stderr
    run_dir = tmp_path / "runs" / "digits" / "job-777"  # a requeued job finds its folder by job id
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["global_step"] == 8
    assert [p.name for p in (run_dir / "checkpoints").glob("last*")] == ["last.ckpt"]  # the resume never versions it
    assert results.status(run_dir)[0] == "interrupted"  # what kiln.results lists for the run
    assert results.runs(tmp_path / "runs").resumable.tolist() == [True]
    requeued = (tmp_path / "scontrol.log").read_text() if (tmp_path / "scontrol.log").exists() else ""
    assert requeued == ("requeue 777\n" if name == "SIGUSR1" else "")

    second = launch(tmp_path / "runs", *probe)  # the same command: the marker keeps the probe quiet
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"resuming from {run_dir / 'checkpoints' / 'last.ckpt'}" in second.stderr
    assert [p.name for p in (run_dir / "checkpoints").glob("last*")] == ["last.ckpt"]
    ids = {p.name.rsplit("-", 1)[-1] for p in run_dir.glob("wandb/offline-run-*")}
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2 and len(ids) == 1  # one W&B run, continued
    assert results.status(run_dir) == ("finished", "")

    assert_bitwise_equal(final_state(str(run_dir)), final_state(str(uninterrupted_job)))  # with 0 workers: any count


def _checkpoint_bookkeeping(run_dir: Path) -> dict:
    """The best-checkpoint state of ``last.ckpt``, with file names instead of paths (the runs' folders differ)."""
    state = final_state(str(run_dir))["callbacks"]
    (key,) = [k for k in state if k.startswith("ModelCheckpoint")]
    mc = state[key]
    return {
        "best": Path(mc["best_model_path"]).name,
        "scores": [mc["best_model_score"], mc["current_score"], *mc["best_k_models"].values()],
    }


VALIDATED = [
    sys.executable, "-m", "kiln", "fit", "-c", str(CONFIGS / "trainer" / "deterministic.yaml"),
    "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "3",
    "--trainer.limit_test_batches", "2", "--trainer.logger", "false", "--run.test_ckpt", "best", "--ckpt_path", "last",
]  # fmt: skip


@pytest.fixture(scope="module")
def validated_whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of the run never stopped, which both validation-signal tests compare with."""
    root = tmp_path_factory.mktemp("whole")
    done = forkserver.run([*VALIDATED, "--run.root", str(root)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (whole,) = root.glob("digits/*")
    return whole


@pytest.mark.slow
@pytest.mark.real_process  # a stop in validation: the fork proof covers one in a training step
@pytest.mark.parametrize("epoch", [1, 2], ids=["middle_epoch", "last_epoch"])
def test_sigterm_during_validation_is_validated_again_on_resume(
    tmp_path: Path, epoch: int, validated_whole: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": PROBES}
    args = VALIDATED
    probe = ["--trainer.callbacks+=probes.SignalInEvaluation", "--trainer.callbacks.stage=validate",
             f"--trainer.callbacks.epoch={epoch}", "--trainer.callbacks.batch=0",
             f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip

    def launch(root: str, *extra: str) -> subprocess.CompletedProcess:
        return forkserver.run([*args, "--run.root", root, *extra], capture_output=True, text=True, env=env, timeout=300)

    first = launch("cut", *probe)  # SIGTERM in an epoch's validation, after its first batch
    assert first.returncode == 143, first.stderr[-2000:]
    assert f"SIGTERM: stopped after step {4 * (epoch + 1)} (in validation, which runs again" in first.stderr
    second = launch("cut", *probe)
    assert second.returncode == 0, second.stderr[-2000:]
    (cut,), whole = list(Path(tmp_path, "cut").glob("digits/*")), validated_whole
    assert _checkpoint_bookkeeping(cut) == _checkpoint_bookkeeping(whole)  # the cut epoch was validated
    for key, value in final_state(str(cut))["state_dict"].items():
        assert torch.equal(value, final_state(str(whole))["state_dict"][key]), key
    tested = [json.loads((d / "metrics.json").read_text())["test"] for d in (cut, whole)]
    for result in tested:
        result[0]["checkpoint"] = Path(result[0]["checkpoint"]).name
    assert tested[0] == tested[1]


@pytest.mark.slow
def test_a_sigterm_inside_a_gradient_accumulation_stops_after_its_step_and_resumes_to_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """Saved after batch 5 of a 4-batch accumulation, the checkpoint lacked the gradients of batches 4 and 5: the
    resumed run ended with other weights (max |diff| 0.14) at the same step, and nothing said so."""
    command = [sys.executable, "-m", "kiln", "fit", "-c", str(CONFIGS / "trainer" / "deterministic.yaml"),
               "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "1",
               "--trainer.accumulate_grad_batches", "4", "--trainer.logger", "false", "--run.test_after_fit",
               "false", "--ckpt_path", "last"]  # fmt: skip  # steps at batches 3 and 5 of each epoch
    probe = ["--trainer.callbacks+=probes.SignalInTraining", "--trainer.callbacks.batch=1",
             "--trainer.callbacks.epoch=1", f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip

    def launch(root: str, *extra: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": PROBES}
        return forkserver.run([*command, "--run.root", str(tmp_path / root), *extra], capture_output=True, text=True,
                              env=env, timeout=300)  # fmt: skip

    assert launch("whole").returncode == 0
    first = launch("cut", *probe)  # after batch 1 of epoch 1, inside the accumulation that steps at batch 3
    assert first.returncode == 143 and "SIGTERM: stopped after step 3, saved " in first.stderr, first.stderr[-2000:]
    assert launch("cut", *probe).returncode == 0
    (whole,), (cut,) = (list((tmp_path / root).glob("digits/*")) for root in ("whole", "cut"))
    assert_bitwise_equal(final_state(str(cut)), final_state(str(whole)), steps=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of a short run, for the subcommands that evaluate one."""
    root = tmp_path_factory.mktemp("trained")
    cli = build_cli(
        ["fit", *LIMIT, "--trainer.logger", "false", "--run.test_after_fit", "false", "--run.root", str(root)]
    )
    return Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt"


def _with_scontrol(tmp_path: Path) -> dict[str, str]:
    """An environment inside SLURM job 777 whose ``scontrol`` records what a requeue would do."""
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    scontrol.chmod(0o755)
    return {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": PROBES,
            "PATH": f"{scontrol.parent}:{os.environ['PATH']}", "SLURM_JOB_ID": "777"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.real_process  # evaluation's stops: the fork proof (test_forkserver.py) covers fit's
@pytest.mark.parametrize(
    ("stage", "name", "code", "said"),
    [("test", "SIGTERM", 143, "SIGTERM: stopped test"), ("predict", "SIGUSR1", 138, "SIGUSR1: stopped predict"),
     ("validate", "SIGUSR1", 138, "SIGUSR1: stopped validate")],
)  # fmt: skip
def test_a_signal_stops_validate_test_and_predict_in_one_line(
    trained: Path, tmp_path: Path, stage: str, name: str, code: int, said: str
) -> None:
    probe = ["--trainer.callbacks+=probes.SignalInEvaluation", f"--trainer.callbacks.stage={stage}",
             "--trainer.callbacks.batch=0", f"--trainer.callbacks.marker={tmp_path / 'sent'}",
             f"--trainer.callbacks.name={name}"]  # fmt: skip
    cmd = [sys.executable, "-m", "kiln", stage, *LIMIT, "--trainer.logger", "false", "--ckpt_path", str(trained)]
    done = forkserver.run([*cmd, *probe], capture_output=True, text=True, env=_with_scontrol(tmp_path), timeout=300)
    assert done.returncode == code, done.stderr[-2000:]  # before: killed by the default handler, no word said
    assert said in done.stderr and "Traceback" not in done.stderr
    requeued = (tmp_path / "scontrol.log").read_text() if (tmp_path / "scontrol.log").exists() else ""
    assert requeued == ("requeue 777\n" if name == "SIGUSR1" else "")


@pytest.mark.slow
@pytest.mark.real_process  # a stop in the test after fit: the fork proof covers one in a training step
def test_a_signal_during_the_test_after_fit_keeps_the_training_and_the_rerun_only_tests(tmp_path: Path) -> None:
    probe = ["--trainer.callbacks+=probes.SignalInEvaluation", "--trainer.callbacks.stage=test",
             "--trainer.callbacks.batch=0", f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip
    cmd = [sys.executable, "-m", "kiln", "fit", *LIMIT, "--trainer.logger", "false", "--run.root", str(tmp_path),
           "--ckpt_path", "last", *probe]  # fmt: skip
    env = _with_scontrol(tmp_path)
    first = forkserver.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 143, first.stderr[-2000:]
    assert "the test after fit was stopped; training is complete" in first.stderr
    (run_dir,) = (tmp_path / "digits").iterdir()
    assert "test" not in json.loads((run_dir / "metrics.json").read_text())  # fit's section only
    saved = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "checkpoints").iterdir()}
    second = forkserver.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    # not retrained: a training run (from scratch, too) writes every checkpoint anew; the test scored step 10's
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "checkpoints").iterdir()} == saved
    tested = json.loads((run_dir / "metrics.json").read_text())["test"]
    assert tested and all(t["step"] == 10 for t in tested)


@pytest.mark.slow
def test_a_resume_with_another_batch_size_neither_replays_nor_skips_samples(tmp_path: Path) -> None:
    base = ["fit", *LIMIT, "--trainer.max_epochs", "1", "--trainer.logger", "false", "--run.test_after_fit", "false"]

    def labels(run: str, batch_size: int, *extra: str) -> list[list[int]]:
        record = ["--trainer.callbacks+=probes.RecordLabels", f"--trainer.callbacks.path={tmp_path / run}.jsonl"]
        build_cli([*base, "--data.batch_size", str(batch_size), "--run.root", str(tmp_path / run), *record, *extra])
        return [json.loads(line) for line in (tmp_path / f"{run}.jsonl").read_text().splitlines()]

    every_2 = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=2",
               "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename=mid-{step}"]  # fmt: skip
    labels("first", 32, *every_2)  # 2 steps of 32: samples 0-63 of the epoch's order are trained on
    (mid,) = (tmp_path / "first").glob("digits/*/checkpoints/mid-step=2.ckpt")
    resumed = labels("resumed", 16, "--ckpt_path", str(mid))
    reference = labels("reference", 16)  # the same order in batches of 16: samples 64-79 are its fifth batch
    assert resumed[0] == reference[4]  # before, the position was 2 batches: samples 32-47 were trained on again


@pytest.mark.slow
def test_last_and_best_never_pick_a_debug_run_for_a_full_one(capsys: pytest.CaptureFixture) -> None:
    quiet = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--run.test_after_fit", "false"]
    full = build_cli(["fit", "--trainer.max_epochs", "1", *quiet])  # all of the data
    debug = build_cli(["fit", *LIMIT, *quiet])  # newer, under the same run name
    capsys.readouterr()
    resumed = build_cli(["fit", "--trainer.max_epochs", "2", "--ckpt_path", "last", *quiet])
    assert resumed.run_dir == full.run_dir and resumed.trainer.current_epoch == 2
    err = capsys.readouterr().err
    assert debug.run_dir is not None and full.run_dir is not None
    assert f"--ckpt_path last: left out 1 newer run(s) on part of the data: {debug.run_dir.name} " in err
    assert "(limit_train_batches=5)" in err
    tested = build_cli(["test", "--ckpt_path", "best", "--trainer.logger", "false"])
    assert str(tested.config.test.ckpt_path).startswith(str(full.run_dir))  # the full run's best, not the debug one's
    again = build_cli(["fit", *LIMIT, "--trainer.max_epochs", "3", "--ckpt_path", "last", *quiet])  # debug: its own
    assert again.run_dir == debug.run_dir and again.trainer.current_epoch == 3


def test_one_batch_per_epoch_is_part_of_the_data_and_all_of_them_is_not() -> None:
    """Lightning's ``limit_train_batches: 1`` is one batch, its ``1.0`` all of them: ``1 == 1.0`` made a one-batch
    run a run on all of the data, which `--ckpt_path last` of a full run would then resume."""
    from kiln.runs.picking import partial_data

    assert partial_data({"limit_train_batches": 1}) == "limit_train_batches=1"
    assert partial_data({"limit_val_batches": 1}) == "limit_val_batches=1"
    assert partial_data({"limit_train_batches": 1.0, "limit_val_batches": None, "overfit_batches": 0.0}) is None


@pytest.mark.slow
def test_a_moved_run_folder_resumes_with_the_same_best_checkpoint_as_in_place(tmp_path: Path) -> None:
    quiet = [*LIMIT, "--trainer.logger", "false", "--run.test_after_fit", "false"]
    build_cli(["fit", *quiet, "--run.root", str(tmp_path / "here")])
    shutil.copytree(tmp_path / "here", tmp_path / "moved")  # `mv`, with the original kept to compare
    restored = {}
    for root in ("here", "moved"):
        probe = ["--trainer.callbacks+=probes.RecordRestoredBest", f"--trainer.callbacks.path={tmp_path / root}.json"]
        build_cli(["fit", *quiet, *probe, "--ckpt_path", "last", "--trainer.max_epochs", "3", "--run.root",
                   str(tmp_path / root)])  # fmt: skip
        restored[root] = json.loads((tmp_path / f"{root}.json").read_text())
    here, moved = restored["here"], restored["moved"]
    assert Path(moved["path"]).name == Path(here["path"]).name != "" and moved["path"].startswith(
        str(tmp_path / "moved")
    )
    assert moved["score"] == here["score"]  # Lightning forgot the best when the folder changed


def sigterm_once_handled(process: subprocess.Popen) -> None:
    """SIGTERM to ``process`` as soon as it handles the signal (its /proc status says so): from its start on."""
    status = Path(f"/proc/{process.pid}/status")
    while process.poll() is None:
        caught = next(
            (int(line.split()[1], 16) for line in status.read_text().splitlines() if line.startswith("SigCgt")), 0
        )
        if caught & (1 << (signal.SIGTERM - 1)):
            process.send_signal(signal.SIGTERM)
            return
        time.sleep(0.01)


def test_a_stop_signal_that_comes_as_the_handlers_are_set_is_kept() -> None:
    """The first handler noted a SIGTERM sent the moment it was set, then the start's reset forgot it: seen once in
    CI, a multirun SIGTERMed at its start trained all its runs and exited 0. A pending signal makes it certain."""
    code = (
        "import os, signal\n"
        "from kiln.process import stop_signals\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "stop_signals.install()\n"
        "print(stop_signals.received())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "SIGTERM", done.stderr  # was None


@pytest.mark.slow
@pytest.mark.parametrize("when", ["setup", "between_fit_and_test", "export", "multirun"])
def test_a_sigterm_at_any_moment_of_a_command_stops_it_with_one_line_and_143(when: str, tmp_path: Path) -> None:
    quiet = [*LIMIT, "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    kiln = [sys.executable, "-m", "kiln"]
    if when == "export":
        fit = build_cli(["fit", *quiet, "--run.root", str(tmp_path / "runs"), "--run.test_after_fit", "false"])
        last = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        command = [*kiln, "export", "--ckpt_path", str(last), "--output", str(tmp_path / "served")]
    elif when == "multirun":
        command = [*kiln, "multirun", "--seeds", "0-2", "--", *quiet]
    elif when == "setup":
        command = [*kiln, "fit", *quiet]
    else:  # a probe sends it after fit, as Lightning's own handler is gone
        command = [
            *kiln,
            "fit",
            *quiet,
            "--trainer.callbacks+=probes.SignalAtHook",
            "--trainer.callbacks.hook=on_fit_end",
        ]
    if when == "between_fit_and_test":  # the command signals itself: forked from the preloaded test server
        done = forkserver.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        code, stderr = done.returncode, done.stderr
    else:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        sigterm_once_handled(process)  # while it imports, parses, loads data: before any training or writing
        stderr = process.communicate(timeout=300)[1]
        code = process.returncode
    assert code == 143, stderr[-2000:]  # was 0: trained, tested or exported in full
    assert "Traceback" not in stderr and "killed by signal" not in stderr
    if when == "export":
        assert "SIGTERM: kiln export stopped; nothing was written" in stderr and not (tmp_path / "served").exists()
        assert not list(tmp_path.glob(".served.*"))  # no staging folder left
    elif when == "multirun":
        assert "kiln multirun stopped" in stderr or "stopped after step" in stderr
    elif when == "setup":
        assert "SIGTERM: stopped after step 0" in stderr
    else:
        assert "the test after fit was stopped; training is complete" in stderr
        (run,) = (tmp_path / "runs" / "digits").iterdir()
        assert "test" not in json.loads((run / "metrics.json").read_text())  # the test never began


@pytest.mark.slow
@pytest.mark.parametrize("step", [1, 5], ids=["first_step", "in_validation"])  # limit: 5 steps an epoch
def test_a_process_group_sigterm_early_or_in_validation_ends_in_one_line_without_a_worker_traceback(
    step: int, tmp_path: Path
) -> None:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": PROBES}
    probe = ["--trainer.callbacks+=probes.SignalAtStep", f"--trainer.callbacks.step={step}",
             f"--trainer.callbacks.marker={tmp_path / 'sent'}", "--trainer.callbacks.group=true"]  # fmt: skip
    if step == 5:  # sent at the epoch's last step: it arrives while validation runs
        probe += ["--trainer.limit_val_batches", "20"]
    command = [*signal_command(2), "--run.root", str(tmp_path / "runs"), *probe]
    done = forkserver.run(command, capture_output=True, text=True, env=env, timeout=300, start_new_session=True)
    assert done.returncode == 143, done.stderr[-2000:]
    assert "killed by signal" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["mid-step=8.ckpt", "end-epoch=1.ckpt"])
def test_a_resumed_runs_metrics_csv_goes_on_as_the_uninterrupted_runs(tmp_path: Path, checkpoint: str) -> None:
    logged = ["--trainer.logger", "kiln.training.loggers.Csv", "--trainer.log_every_n_steps", "2"]
    whole = Path(build_cli([*run_args(0), *logged, "--run.root", str(tmp_path / "whole")]).trainer.default_root_dir)
    killed = tmp_path / "killed" / "digits" / whole.name  # as if killed at step 12, after a checkpoint mid-epoch
    shutil.copytree(whole, killed)  # (step 8) or at an epoch's end (step 12), with the rows it logged past it
    shutil.copy(killed / "checkpoints" / checkpoint, killed / "checkpoints" / "last.ckpt")
    header, *rows = (whole / "metrics.csv").read_text().splitlines(keepends=True)
    step = header.rstrip().split(",").index("step")
    (killed / "metrics.csv").write_text(header + "".join(r for r in rows if int(r.split(",")[step]) <= 12))
    build_cli([*run_args(0), *logged, "--run.root", str(tmp_path / "killed"), "--ckpt_path", "last"])
    assert (killed / "metrics.csv").read_text() == (whole / "metrics.csv").read_text()  # none lost, none twice


@pytest.mark.slow
@pytest.mark.parametrize("data", ["PlainDigits", "WeightedDigits", "StreamedDigits", "WorkerDigits"])
def test_a_plain_datamodule_resumes_mid_epoch_exactly_or_with_one_line_saying_it_is_not_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: str
) -> None:
    """A shuffling DataLoader of the user's own, with a worker that is not persistent too: its order made resumable
    (exact: test_own_task.py); a sampler of its own: one line."""
    from kiln.commands.boundary import main

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    args = ["fit", "--data", f"probes.{data}", "--model.init_args.num_classes", "10",
            "--model.init_args.net.init_args.in_channels", "1", "--trainer.max_epochs", "2",
            "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2", "--trainer.logger", "false",
            "--run.test_after_fit", "false", "--run.root", str(tmp_path), "--trainer.callbacks+=ModelCheckpoint",
            "--trainer.callbacks.every_n_train_steps=4", "--trainer.callbacks.save_top_k=-1",
            "--trainer.callbacks.filename=mid-{step}", "--run.name", "plain_digits"]  # fmt: skip
    main(args)
    mid = next(tmp_path.glob("plain_digits/*/checkpoints/mid-step=4.ckpt"))
    main([*args, "--ckpt_path", str(mid)])  # was: internal error (exact mid-epoch resume needs … resume_position)
    log = "".join(p.read_text() for p in tmp_path.glob("plain_digits/*/console.log"))  # the console's lines, kept
    said = [line.split(": ", 1)[1] for line in log.splitlines() if "cannot resume its training order" in line]
    # PlainDigits was told so too, before kiln made its order resumable
    why = {
        "WeightedDigits": "its loader's sampler is its own: give the datamodule resume_at(epoch, samples) for an "
        "exact resume (kiln.data.ResumableSampler does it)",
        "StreamedDigits": "it reads an IterableDataset, whose position only the dataset could keep",
    }
    assert said == ([] if data in ("PlainDigits", "WorkerDigits") else [
        f"{data} cannot resume its training order mid-epoch: the rest of epoch 0 is drawn from the start of its data "
        f"again (some samples twice, some not at all); {why[data]}"
    ])  # fmt: skip


@pytest.mark.slow
def test_a_stop_signal_the_launching_process_blocked_still_stops_the_run(tmp_path: Path) -> None:
    """A process inherits its parent's blocked signals: with SIGUSR1 blocked by what launched it (seen under
    pytest on a GPU machine), the preemption warning stayed pending and the run trained on to its end, exit 0."""
    command = [sys.executable, "-m", "kiln", "fit", *LIMIT, "--trainer.logger", "false", "--run.test_after_fit",
               "false", "--data.num_workers", "0", "--trainer.callbacks+=probes.SignalAtStep",
               "--trainer.callbacks.step=3", "--trainer.callbacks.name=SIGUSR1",
               f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}

    def block() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, preexec_fn=block)
    assert done.returncode == 138, done.stderr[-2000:]
    assert "SIGUSR1: stopped after step 3" in done.stderr
    # a native library that took SIGUSR1 over while the Trainer was built (OpenMPI, started by mpi4py when Lightning
    # looks for an MPI environment: seen on a GPU machine, where every SIGUSR1 went unheard and the run trained on)
    (tmp_path / "sent").unlink()
    taken = forkserver.run([*command, "--trainer.callbacks+=probes.NativeSignalTakeover"], env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert taken.returncode == 138, taken.stderr[-2000:]


@pytest.mark.slow
def test_a_stopped_rank_that_slurm_sigterms_as_it_exits_still_exits_with_the_stops_code(tmp_path: Path) -> None:
    """Rank 0 requeues the job as it stops, and SLURM then SIGTERMs every task: seen in the real-SLURM test, a rank
    past Python's finalization (the default handler back) died "Terminated", not with 138."""
    command = [sys.executable, "-m", "kiln", "fit", *LIMIT, "--trainer.logger", "false", "--run.test_after_fit",
               "false", "--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=3",
               "--trainer.callbacks.name=SIGUSR1", f"--trainer.callbacks.marker={tmp_path / 'sent'}",
               "--trainer.callbacks+=probes.SigtermAsPythonFinalizes"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 138, done.stderr[-2000:]  # was -15
    assert "SIGUSR1: stopped after step 3" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("name", "code"), [("SIGUSR1", 138), ("SIGTERM", 143)])
def test_a_stop_at_any_step_resumes_to_the_uninterrupted_runs_metrics_csv_and_weights(
    tmp_path: Path, name: str, code: int
) -> None:
    """Every step from 0 (the run's start-up, where SLURM's `--signal=SIGUSR1@90` may come) to one past the first
    epoch's end (for SIGTERM, whose mid-epoch path is SIGUSR1's, those around the epoch's end). Saved at a batch's
    start, the checkpoint made Lightning count the last step again (every later row of metrics.csv one step off);
    at an epoch's first batch, at step 0 (17 rows of 20, train/loss at step 19 for 9) and after a mid-epoch
    validation, Lightning took the save for one written at a validation and counted a step more; a SIGTERM in the
    epoch's validation lost its last training step's rows."""
    command = [sys.executable, "-m", "kiln", "fit", "--trainer.max_epochs", "2", "--trainer.limit_train_batches",
               "4", "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps", "1", "--trainer.logger",
               "kiln.training.loggers.Csv", "--run.test_after_fit", "false", "--data.num_workers", "0"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}

    def run(root: str, *extra: str) -> subprocess.CompletedProcess:
        return forkserver.run([*command, "--run.root", str(tmp_path / root), *extra], env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    mid_validation = ["--trainer.val_check_interval", "2"]  # a validation after step 2 as well
    every = range(6) if name == "SIGUSR1" else [0, 3, 4, 5]  # SIGTERM: start, an epoch's end either side, its next
    for setting, steps in [([], every), (mid_validation, [2])]:  # 4 steps an epoch
        assert run(f"whole{setting}", *setting).returncode == 0
        (whole,) = (tmp_path / f"whole{setting}").glob("digits/*")
        for step in steps:
            probe = ["--trainer.callbacks+=probes.SignalAtStep", f"--trainer.callbacks.step={step}",
                     f"--trainer.callbacks.name={name}",
                     f"--trainer.callbacks.marker={tmp_path / f'sent{step}{setting}'}", *setting]  # fmt: skip
            cut = run(f"cut{step}{setting}", *probe)
            assert cut.returncode == code and f"{name}: stopped after step {step}" in cut.stderr, cut.stderr[-2000:]
            resumed = run(f"cut{step}{setting}", *probe, "--ckpt_path", "last")
            assert resumed.returncode == 0, resumed.stderr[-2000:]
            assert "your dataloader is not resumable" not in resumed.stderr  # Lightning's, not so for kiln's data
            (cut_dir,) = (tmp_path / f"cut{step}{setting}").glob("digits/*")
            csv = (cut_dir / "metrics.csv").read_text()
            assert csv == (whole / "metrics.csv").read_text(), f"stopped at {step} {setting}"
            assert_bitwise_equal(final_state(str(cut_dir)), final_state(str(whole)), steps=8)


@pytest.mark.slow
@pytest.mark.real_process  # DDP's ranks: no fork proof covers them
@pytest.mark.parametrize("data", ["digits", "plain"])
def test_a_process_group_sigterm_under_ddp_saves_on_every_rank_and_the_resume_is_the_uninterrupted_run(
    tmp_path: Path, data: str
) -> None:
    """Lightning broadcasts from its SIGTERM handler once per signal: rank 1, signalled by the group and again by
    rank 0, broadcast twice, and both ranks waited forever (or crashed on a collective mismatch). ``plain``: a plain
    shuffling DataLoader (Lightning's DistributedSampler under DDP) stopped mid-epoch resumes bitwise too (was: the
    epoch drawn from its start again, said in one line)."""
    plain = ["--data", "probes.PlainDigits", "--model.init_args.num_classes", "10", "--run.name", "digits",
             "--model.init_args.net.init_args.in_channels", "1"]  # fmt: skip
    command = [sys.executable, "-m", "kiln", "fit", "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"),
               "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1",
               "--trainer.log_every_n_steps", "1", "--trainer.logger", "kiln.training.loggers.Csv",
               "--run.test_after_fit", "false", *(plain if data == "plain" else ["--data.num_workers=0"])]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    step = 4 if data == "digits" else 6  # the first epoch's last step, or two batches into the second
    probe = ["--trainer.callbacks+=probes.SignalAtStep", f"--trainer.callbacks.step={step}",
             "--trainer.callbacks.group=true", f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip

    def run(root: str, *extra: str) -> subprocess.CompletedProcess:
        return forkserver.run([*command, "--run.root", str(tmp_path / root), *extra], env=env, capture_output=True,
                              text=True, timeout=120, start_new_session=True)  # fmt: skip

    assert run("whole").returncode == 0
    cut = run("cut", *probe)
    assert cut.returncode == 143, cut.stderr[-2000:]
    assert f"SIGTERM: stopped after step {step}" in cut.stderr  # every rank stopped there
    (cut_dir,) = (tmp_path / "cut" / "digits").iterdir()
    assert results.status(cut_dir)[0] == "interrupted"
    resumed = run("cut", *probe, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "cannot resume" not in resumed.stderr
    (whole_dir,) = (tmp_path / "whole" / "digits").iterdir()
    assert (cut_dir / "metrics.csv").read_text() == (whole_dir / "metrics.csv").read_text()
    assert_bitwise_equal(final_state(str(cut_dir)), final_state(str(whole_dir)), steps=8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_sigterm_during_compiled_bf16_gpu_steps_resumes_bitwise_to_the_uninterrupted_run(tmp_path: Path) -> None:
    """The GPU preset with torch.compile, channels-last and deterministic kernels: a SIGTERM at step 8 (mid-epoch),
    then the same command (``--ckpt_path last``), ends where the uninterrupted run does, weights and optimizer state
    bit for bit."""
    presets = ["-c", str(CONFIGS / "trainer" / "gpu.yaml"), "-c", str(CONFIGS / "trainer" / "deterministic.yaml"),
               "--trainer.callbacks+", "kiln.callbacks.Compile",
               "--trainer.callbacks+", "kiln.callbacks.ChannelsLast"]  # fmt: skip
    base = [sys.executable, "-m", "kiln", *run_args(0)[:-8], *presets, "--ckpt_path", "last"]  # fmt: skip
    env = {**os.environ, "SLURM_JOB_ID": "778", "PYTHONPATH": PROBES}  # a job id: the rerun finds its folder

    def launch(root: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, "--run.root", str(tmp_path / root), *extra], capture_output=True, text=True,
                              env=env, timeout=600)  # fmt: skip

    whole = launch("whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    probe = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=8",
             f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip
    cut = launch("cut", *probe)
    assert cut.returncode == 143 and "SIGTERM: stopped after step 8" in cut.stderr, cut.stderr[-3000:]
    again = launch("cut", *probe)
    assert again.returncode == 0 and "resuming from" in again.stderr, again.stderr[-3000:]
    job = Path("digits") / "job-778"
    assert_bitwise_equal(final_state(str(tmp_path / "cut" / job)), final_state(str(tmp_path / "whole" / job)))
