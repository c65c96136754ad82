"""The command line as a user meets it: run folders, W&B offline, summaries, predictions, bad input."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest
import torch
from helpers import CONFIGS, LIMIT, PROBES

from kiln import results
from kiln.callbacks.predictions import merged_line
from kiln.cli import build_cli
from kiln.commands.boundary import main
from kiln.errors import UsageError


def run_dirs(root: Path = Path("runs/digits")) -> list[Path]:
    return sorted(p.resolve() for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def test_fit_fills_one_run_folder_and_prints_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("WANDB_MODE")  # no key and no mode: must fall back to offline, not prompt
    main(["fit", *LIMIT])
    (run_dir,) = run_dirs()
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "last.ckpt" in checkpoints and any(name.startswith("best-") for name in checkpoints)
    assert (run_dir / "config.yaml").is_file()
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if line.startswith("W&B: no API key")]
    assert len(notices) == 1 and "offline" in notices[0]
    assert "WANDB_MODE" not in os.environ  # the session as it was: the next command decides for itself


@pytest.mark.slow
def test_summary_names_metrics_checkpoint_folder_and_sync_and_ends_the_console(tmp_path: Path) -> None:
    # one console for both streams: W&B prints its history as it closes, from its own process, on the same one
    (tmp_path / "srun").write_text("#!/bin/sh\n")  # a machine with SLURM installed: Lightning hinted at srun twice
    (tmp_path / "srun").chmod(0o755)
    env = {**os.environ, "WANDB_MODE": "offline", "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = forkserver.run([sys.executable, "-m", "kiln", "fit", *LIMIT], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    (run_dir,) = run_dirs()
    out = done.stdout
    assert "test/acc" in out and "test/loss" in out
    assert str(run_dir) in out
    assert "checkpoints/best-" in out
    assert f"wandb sync {run_dir}/wandb/offline-run-" in out
    last = [line for line in out.splitlines() if line.strip()][-1]
    assert last.startswith(f"W&B offline; upload with wandb sync {run_dir}/wandb/offline-run-"), out[-1500:]
    # a quiet console: none of the noise Lightning and torch printed on every run
    noises = (
        "💡 Tip",
        "Trainer already configured",
        "`weights_only` was not set",
        "LeafSpec",
        "Total FLOPs: 0",
        "srun",
    )
    for noise in noises:
        assert noise not in out, noise
    assert "Total FLOPs: 3.6 M" in out  # the summary's forward ran on an input of the data's shape


def test_wandb_run_config_holds_resolved_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    main(["fit", *LIMIT, "--run.test_after_fit", "false"])
    (run_dir,) = run_dirs()
    (run_log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")  # the offline run's record, as synced later
    record = run_log.read_bytes()  # complete as the command returns: W&B's service has closed it
    assert b"research.data.DigitsDataModule" in record and b'limit_train_batches":5' in record


def test_a_wandb_runs_history_is_whole_as_soon_as_its_command_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    services = wandb_services()
    main(["fit", *LIMIT])
    (run_dir,) = run_dirs()
    read_at_once = results.history(run_dir)  # as a notebook reads it on the next line
    assert wandb_services() <= services  # W&B's service, which writes the file, has closed it and ended
    import wandb

    wandb.teardown()
    assert read_at_once.equals(results.history(run_dir)) and len(read_at_once) > 7


def wandb_services() -> set[str]:
    """The process ids of this process's W&B service children (Linux's /proc)."""
    pids = " ".join(Path(task, "children").read_text() for task in Path("/proc/self/task").iterdir()).split()
    comm = {pid: Path(f"/proc/{pid}/comm") for pid in pids}
    return {pid for pid, path in comm.items() if path.exists() and path.read_text().strip() == "wandb-core"}


def test_second_run_gets_its_own_folder() -> None:
    args = ["fit", *LIMIT, "--trainer.max_epochs", "1", "--run.test_after_fit", "false"]
    main(args)
    main(args)
    first, second = run_dirs()
    assert (first / "config.yaml").is_file() and (second / "config.yaml").is_file()


def test_wandb_mode_set_by_user_is_respected(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    main(["fit", *LIMIT, "--run.test_after_fit", "false"])
    (run_dir,) = run_dirs()
    assert not list(run_dir.glob("wandb/offline-run-*"))
    assert "W&B: no API key" not in capsys.readouterr().err


@pytest.mark.parametrize("on_device", [False, True], ids=["loader", "on_device"])
def test_predict_writes_probabilities_to_run_folder(on_device: bool, capsys: pytest.CaptureFixture) -> None:
    data = ["--data.on_device", str(on_device).lower()]
    fit = build_cli(["fit", *LIMIT, *data, "--run.test_after_fit", "false", "--trainer.logger", "false"])
    ckpt = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    main(["predict", *data, "--ckpt_path", str(ckpt), "--trainer.logger", "false"])
    predict_dir = next(d for d in run_dirs() if str(d) != fit.trainer.default_root_dir)
    assert predict_dir.name.startswith("predict-")  # apart from the training runs (was named like one)
    assert f"predictions: {predict_dir / 'predictions.csv'} (359 rows)" in capsys.readouterr().err  # says where
    assert not list(predict_dir.glob(".*partial"))
    with (predict_dir / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 359  # the digits test split
    probs = [float(rows[0][f"p{c}"]) for c in range(10)]
    assert sum(probs) == pytest.approx(1.0, abs=1e-4)
    assert int(rows[0]["predicted"]) == max(range(10), key=probs.__getitem__)
    assert [int(r["index"]) for r in rows] == list(range(359))  # the test split, in order


def test_rank_files_merge_in_dataset_order_each_sample_once_or_rank_by_rank_and_an_unseen_one_is_named(
    tmp_path: Path,
) -> None:
    """What rank 0 does with the ranks' predictions under DDP (the whole command: test_trainer_features.py)."""
    path, own = tmp_path / "predictions.csv", tmp_path / ".predictions.csv.partial"  # rank 0's share, kept partial
    write = lambda name, rows: (tmp_path / name).write_text("".join(f"{r}\n" for r in ["index,p", *rows]))  # noqa: E731
    write(own.name, ["0,a", "3,d"])  # a DistributedSampler's shares of 5 samples on 3 ranks, padded to 6
    write("predictions-rank1.csv", ["1,b", "4,e"])
    write("predictions-rank2.csv", ["2,c", "0,a"])  # the padding repeats sample 0, last
    assert merged_line(path, own, 3) == f"predictions: {path} (5 rows from 3 of 3 ranks, in dataset order)"
    assert path.read_text().split() == ["index,p", "0,a", "1,b", "2,c", "3,d", "4,e"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.csv"]
    write(own.name, ["2,c", "0,a"])  # a sampler of the user's own order
    write("predictions-rank1.csv", ["1,b"])
    write("predictions-rank2.csv", [])
    assert merged_line(path, own, 3).endswith(
        "(3 rows from 3 of 3 ranks, by index as each rank's sampler ordered them)"
    )
    write(own.name, [",a", ",c"])  # an iterable loader under DDP: no dataset index
    write("predictions-rank1.csv", [",b"])
    line = merged_line(path, own, 3)
    assert line == (f"predictions: {path} (3 rows from 2 of 3 ranks, rank by rank: the loader gives no dataset "
                    "index); not on this disk: predictions-rank2.csv (written on their ranks' machines)")  # fmt: skip
    assert path.read_text().split() == ["index,p", ",a", ",c", ",b"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--model.init_args.no_such_key", "1"], "no_such_key"),
        (["--trainer.max_epochs", "many"], "trainer.max_epochs"),
        (["--data.init_args.batch_size", "big"], "batch_size"),
        (["--trainer.max_epoch", "3"], "--trainer.max_epoch"),  # a typo, not an abbreviation of max_epochs
    ],
)
def test_bad_flag_exits_nonzero_naming_the_key(args: list[str], named: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args])
    assert exit_info.value.code not in (0, None)
    assert named in capsys.readouterr().err
    assert not Path("runs").exists()  # nothing written for a config that never ran


def test_bad_key_in_config_file_names_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epoch: 3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "-c", str(bad)])
    assert exit_info.value.code not in (0, None)
    assert "max_epoch" in capsys.readouterr().err


def test_missing_data_exits_one_line_and_leaves_no_run_folder(capsys: pytest.CaptureFixture) -> None:
    args = ["fit", "-c", str(CONFIGS / "experiment" / "mnist.yaml"), "--data.init_args.download", "false"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "MNIST/raw" in errors[0] and "train-images-idx3-ubyte" in errors[0]
    assert run_dirs(Path("runs/mnist")) == []


@pytest.mark.slow
def test_module_entry_point_help_and_exit_code(tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    # forked from the preloaded test server, as `python -m kiln` (a real interpreter starts it in
    # test_a_run_prints_about_30_lines_and_keeps_the_rest_in_console_log)
    done = forkserver.run([sys.executable, "-m", "kiln", "fit", "--help"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "--trainer.max_epochs" in done.stdout and "--run.name" in done.stdout
    bad = forkserver.run([sys.executable, "-m", "kiln", "fit", "--nope", "1"], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "nope" in bad.stderr


@pytest.mark.slow
def test_help_imports_nothing_the_command_does_not_need() -> None:
    # a fresh interpreter: this test process has long imported W&B. What Lightning's own imports bring is
    # Lightning's (torchmetrics imports transformers when it is installed, which may import scikit-learn)
    probe = "import sys\nfrom lightning.pytorch.cli import LightningCLI\nbase = set(sys.modules)\n"
    probe += "from kiln.commands.boundary import main\ntry: main(['fit', '--help'])\nexcept SystemExit: pass\n"
    probe += "added = set(sys.modules) - base\n"
    probe += (
        "print('imported:', *sorted(m for m in ('wandb', 'sklearn', 'tensorboard', 'timm', 'optuna') if m in added))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "kiln.training.loggers.Wandb" in done.stdout  # the default logger is described ...
    assert done.stdout.splitlines()[-1] == "imported:"  # ... without importing W&B to do it


@pytest.mark.slow
def test_default_experiment_reaches_98_percent_test_accuracy() -> None:
    cli = build_cli(["fit"])  # exactly what `make train` runs
    assert cli.test_metrics is not None
    assert cli.test_metrics["test/acc"] >= 0.98
    assert Path(cli.trainer.checkpoint_callback.best_model_path).name.startswith("best-")  # type: ignore[union-attr]


@pytest.mark.parametrize("subcommand", [pytest.param("validate", marks=pytest.mark.slow), "test"])
def test_evaluation_subcommands_load_a_checkpoint(subcommand: str) -> None:
    fit = build_cli(["fit", *LIMIT, "--run.test_after_fit", "false", "--trainer.logger", "false"])
    ckpt = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    evaluated = build_cli([subcommand, *LIMIT, "--ckpt_path", str(ckpt), "--trainer.logger", "false"])
    metrics = evaluated.trainer.callback_metrics
    stage = "val" if subcommand == "validate" else "test"
    assert f"{stage}/acc" in metrics and f"{stage}/loss" in metrics
    scored, trained = evaluated.model.state_dict(), torch.load(ckpt, weights_only=True)["state_dict"]
    assert all(torch.equal(scored[k], v) for k, v in trained.items())  # the checkpoint's weights, not new ones
    # the same weights give the same validation loss as at the end of fit
    if subcommand == "validate":
        assert float(metrics["val/loss"]) == pytest.approx(float(fit.trainer.callback_metrics["val/loss"]), rel=1e-5)


def test_paths_the_user_set_are_kept_and_said(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    mine = ["--trainer.logger", "CSVLogger", "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
            "--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.dirpath={tmp_path / 'weights'}",
            "--trainer.callbacks.filename=mine-{step}"]  # fmt: skip
    main(["fit", *LIMIT, "--trainer.max_epochs", "1", "--run.test_after_fit", "false", *mine])
    err = capsys.readouterr().err
    assert f"trainer.logger.init_args.save_dir: keeping your '{tmp_path / 'logs'}'" in err
    assert f"trainer.callbacks (ModelCheckpoint).init_args.dirpath: keeping your '{tmp_path / 'weights'}'" in err
    assert (tmp_path / "logs" / "metrics.csv").is_file() and list((tmp_path / "weights").glob("mine-*.ckpt"))


def fingerprint(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time: what a later run must not change."""
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink() and "logs" not in p.parts]
    # (W&B's service keeps writing its own logs, wandb/*/logs, after its runs end)
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["wandb", "csv"])
def test_a_runs_config_yaml_reused_with_c_starts_a_run_of_its_own(logger: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    main(["fit", *LIMIT, "-c", str(CONFIGS / "logger" / f"{logger}.yaml"), "--ckpt_path", "last"])
    (old,) = run_dirs()
    saved = (old / "config.yaml").read_text()
    assert str(old) not in saved and "default_root_dir" not in saved and "ckpt_path: null" not in saved
    before = fingerprint(old)
    main(["fit", "-c", str(old / "config.yaml"), "--trainer.max_epochs", "1"])  # the README's reuse
    new = next(d for d in run_dirs() if d != old)
    assert fingerprint(old) == before  # the old run's checkpoints, metrics and logs untouched
    assert list((new / "checkpoints").glob("best-*.ckpt")) and (new / "metrics.json").is_file()


@pytest.mark.slow
def test_mlflow_logs_each_run_into_one_store_under_the_root_named_by_experiment_and_folder() -> None:
    mlflow = pytest.importorskip("mlflow", reason="needs the dev group (make install)")
    mlflow_logger = ["--trainer.logger", "lightning.pytorch.loggers.MLFlowLogger"]
    for _ in range(2):
        main(["fit", *LIMIT, *mlflow_logger, "--run.test_after_fit", "false"])
    client = mlflow.MlflowClient(f"sqlite:///{Path('runs').resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("digits")  # run.name: the experiment
    assert experiment is not None
    found = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in found) == [d.name for d in run_dirs()]  # each run by its folder
    assert all("val/loss" in r.data.metrics for r in found)


def test_the_lines_of_a_short_run_and_of_a_prediction_say_what_happened(capsys: pytest.CaptureFixture) -> None:
    main(["fit", "-c", str(CONFIGS / "debug" / "fast_dev_run.yaml"), "--trainer.logger", "false"])
    err = capsys.readouterr().out
    assert "tested the final weights (step 1; no checkpoint was saved)" in err  # was "final weights the final …"
    waves = ["-c", str(CONFIGS / "experiment" / "waveforms.yaml"), *LIMIT, "--trainer.logger", "false"]
    fit = build_cli(["fit", *waves, "--run.test_after_fit", "false"])
    capsys.readouterr()
    main(["predict", "--ckpt_path", str(Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"),
          "--trainer.logger", "false"])  # fmt: skip
    assert "keeps num_workers" not in capsys.readouterr().err  # the experiment file set it: nothing was kept


def test_a_path_into_another_runs_folder_is_refused_in_one_line(capsys: pytest.CaptureFixture) -> None:
    main(["fit", *LIMIT, "--trainer.max_epochs", "1", "--run.test_after_fit", "false"])
    (old,) = run_dirs()
    before = fingerprint(old)
    with pytest.raises(SystemExit) as stop:  # e.g. a config.yaml an older kiln wrote, with its run's paths
        main(["fit", *LIMIT, "--trainer.logger", "CSVLogger", f"--trainer.logger.init_args.save_dir={old}"])
    assert stop.value.code == 1
    error = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error:"))
    assert "trainer.logger.init_args.save_dir" in error and f"inside another run's folder ({old})" in error
    assert fingerprint(old) == before and run_dirs() == [old]


def test_a_users_wandb_subclass_is_treated_as_wandb_and_dropped_callbacks_are_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    cli = build_cli([*LIMIT, "--trainer.logger", "probes.TeamWandb"], run=False)
    assert cli.trainer.logger._wandb_init["name"] == f"digits/{cli.run_dir.name}"  # type: ignore[union-attr]
    quiet = build_cli([*LIMIT, "--trainer.logger", "false"], run=False)
    kept = (quiet.run_dir / "console.log").read_text()  # type: ignore[operator]  # the console keeps warnings only
    assert "LearningRateMonitor: left out, as trainer.logger is false" in kept


def test_cpu_threads_sets_torchs_intra_op_threads() -> None:
    before = torch.get_num_threads()
    try:
        build_cli([*LIMIT, "--run.cpu_threads", "1", "--trainer.logger", "false"], run=False)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_configs_are_found_in_a_wheel_and_in_a_checkout_and_missing_is_one_error(tmp_path: Path) -> None:
    from kiln.cli import config_dir
    from kiln.errors import ConfigError

    wheel = tmp_path / "site-packages" / "kiln"  # hatch's force-include puts configs/ inside the package
    (wheel / "configs").mkdir(parents=True)
    (wheel / "configs" / "train.yaml").write_text("{}")
    assert config_dir(wheel) == wheel / "configs"
    checkout = tmp_path / "project" / "src" / "kiln"  # an editable install or a generated project
    checkout.mkdir(parents=True)
    (tmp_path / "project" / "configs").mkdir()
    (tmp_path / "project" / "configs" / "train.yaml").write_text("{}")
    assert config_dir(checkout) == tmp_path / "project" / "configs"
    with pytest.raises(ConfigError, match=r"no default config: neither .* nor .*; reinstall the package"):
        config_dir(tmp_path / "elsewhere" / "lib" / "kiln")


def test_a_switched_class_says_which_default_values_it_kept(capsys: pytest.CaptureFixture) -> None:
    build_cli([*LIMIT, "--model.init_args.optimizer", "torch.optim.Adam", "--trainer.logger", "false"], run=False)
    err = capsys.readouterr().err
    assert "model.init_args.optimizer: Adam keeps lr=0.003, weight_decay=0.01, fused=True from AdamW" in err
    build_cli([*LIMIT, "--model.init_args.optimizer", "torch.optim.Adam", "--model.init_args.optimizer.lr", "0.01",
               "--model.init_args.optimizer.weight_decay", "0", "--trainer.logger", "false"], run=False)  # fmt: skip
    assert "keeps fused=True from AdamW" in capsys.readouterr().err  # only what nobody wrote
    build_cli(["-c", str(CONFIGS / "experiment" / "cifar10.yaml"), "--trainer.logger", "false"], run=False)
    assert "keeps" not in capsys.readouterr().err  # an experiment file that states its values: nothing to say


def test_a_preset_leaves_out_or_replaces_one_default_callback_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    default = [type(c).__name__ for c in build_cli([*LIMIT], run=False).trainer.callbacks]  # type: ignore[attr-defined]
    preset = tmp_path / "swap.yaml"
    preset.write_text(
        "run:\n  without: [BatchGrid, kiln.callbacks.ProgressBar]\n"
        "trainer:\n  callbacks+:\n    - lightning.pytorch.callbacks.RichProgressBar\n"
    )
    swapped = build_cli([*LIMIT, "-c", str(preset)], run=False)
    names = [type(c).__name__ for c in swapped.trainer.callbacks]  # type: ignore[attr-defined]
    assert "BatchGrid" not in names and names.count("RichProgressBar") == 1
    assert sorted(names) == sorted({*default} - {"BatchGrid", "ProgressBar"} | {"RichProgressBar"})
    assert "BatchGrid: left out, as run.without names it" in (swapped.run_dir / "console.log").read_text()  # type: ignore[operator]
    with pytest.raises(UsageError, match=r"run.without: no callback BatchGrd in trainer.callbacks \(.*\); did you"):
        build_cli([*LIMIT, "--run.without", "[BatchGrd]"], run=False)
    replaced = tmp_path / "replace.yaml"
    replaced.write_text(
        "run:\n  without: [ModelCheckpoint]\ntrainer:\n  callbacks+:\n    - class_path: "
        "lightning.pytorch.callbacks.ModelCheckpoint\n      init_args: {monitor: val/acc, mode: max}\n"
    )
    mine = build_cli([*LIMIT, "-c", str(replaced)], run=False).trainer.callbacks  # type: ignore[attr-defined]
    assert type(mine[default.index("ModelCheckpoint")]).__name__ == "ModelCheckpoint"  # in the default's place
    assert [c.monitor for c in mine if type(c).__name__ == "ModelCheckpoint"] == ["val/acc"]
    off = build_cli([*LIMIT, "-c", str(replaced), "--trainer.enable_checkpointing", "false"], run=False)
    assert not off.trainer.checkpoint_callbacks  # the replacement too: Lightning refuses a checkpoint then


def test_every_fit_writes_best_and_last_validation_metrics_and_wall_time() -> None:
    cli = build_cli(["fit", *LIMIT, "--run.test_after_fit", "false", "--trainer.logger", "false"])
    metrics = json.loads((Path(cli.trainer.default_root_dir) / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and metrics["global_step"] == 10 and metrics["wall_seconds"] > 0
    val = metrics["val"]
    assert val["monitor"] == "val/loss" and val["last"]["epoch"] == 1 and "test" not in metrics
    assert val["best"]["val/loss"] == min(val["best"]["val/loss"], val["last"]["val/loss"])
    assert val["best"]["val/loss"] == pytest.approx(cli.trainer.checkpoint_callback.best_model_score.item())  # type: ignore[union-attr]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU")
def test_a_gpu_preset_without_a_gpu_stops_in_one_line_naming_the_file(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", str(CONFIGS / "trainer" / "gpu.yaml")])  # make train TRAINER=gpu
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and not Path("runs").exists()  # was a 40-line MisconfigurationException
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"{CONFIGS / 'trainer' / 'gpu.yaml'}: trainer.accelerator asks for gpu, but torch sees no CUDA GPU" in line


def test_the_slurm_preset_outside_a_slurm_job_step_stops_in_one_line(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as stop:  # was an internal error: KeyError 'SLURM_NODEID', deep in Lightning
        main(["fit", "-c", str(CONFIGS / "trainer" / "slurm.yaml")])
    assert stop.value.code == 1 and not Path("runs").exists()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert (
        f"{CONFIGS / 'trainer' / 'slurm.yaml'}: trainer.plugins+[0].class_path holds Lightning's SLURMEnvironment"
        in line
    )
    assert "this process has no SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID" in line


def test_the_gpu_ddp_preset_on_cpu_processes_stops_in_one_line_naming_sync_batchnorm(
    capsys: pytest.CaptureFixture,
) -> None:
    with pytest.raises(SystemExit) as stop:  # was an internal error: SyncBatchNorm layers only work with GPU modules
        main(["fit", "-c", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.accelerator", "cpu"])
    assert stop.value.code == 1 and not Path("runs").exists()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"{CONFIGS / 'trainer' / 'ddp.yaml'}: trainer.sync_batchnorm is true" in line
    assert "--trainer.sync_batchnorm false" in line


@pytest.mark.parametrize("setting", ["max_epochs", "max_steps", "limit_train_batches"])
def test_a_fit_that_would_train_nothing_exits_non_zero_in_one_line(setting: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["fit", f"--trainer.{setting}", "0"])  # was: an untrained network tested, with a normal summary
    assert stop.value.code == 2 and not Path("runs").exists()
    assert f"error: trainer.{setting} 0: fit would train nothing" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_prints_about_30_lines_and_keeps_the_rest_in_console_log(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_SILENT")}  # W&B offline, as make train
    command = [sys.executable, "-m", "kiln", "fit", *LIMIT]
    many_cores = [*command, "--trainer.callbacks+=probes.ManyCores"]  # as on a 16-core machine
    done = subprocess.run(many_cores, capture_output=True, text=True, env={**env, "PYTHONPATH": PROBES}, cwd=tmp_path,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(printed) <= 32, "\n".join(printed)  # was 108 to 112, 34 of them W&B's
    text = "\n".join(printed)
    assert "does not have many workers" not in text  # tensors in memory: num_workers=15 would only add IPC
    assert "Total params" in text and "Run summary" in text and "wandb sync" in text  # summary, model, where
    assert "Seed set to" not in text and "wandb: Run history" not in text and "Per-class test accuracy" not in text
    assert "leaked" not in text  # frozen beyond torch, Triton's bindings print a "leaked" line per function at exit
    (run,) = (tmp_path / "runs" / "digits").iterdir()
    kept = (run / "console.log").read_text()
    assert "Seed set to 42" in kept and "Restoring states" in kept and "Per-class test accuracy" in kept
    loud = forkserver.run([*command, "-v"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert "Seed set to 42" in loud.stderr + loud.stdout and "Per-class test accuracy" in loud.stderr + loud.stdout


def test_kiln_help_lists_every_subcommand_and_a_flag_before_one_is_named(capsys: pytest.CaptureFixture) -> None:
    """`kiln --help` listed Lightning's 4 of the 11; `kiln --bogus 1` named '1'; `kiln tune --help` exited 2."""
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:] if line.strip()]
    assert listed == ["fit", "validate", "test", "predict", "sweep", "multirun", "export", "infer", "serve", "convert",
                      "diff", "tune"]  # fmt: skip
    for argv, code, expected in [([], 2, "usage: kiln"), (["--bogus", "1"], 2, "error: kiln --bogus: unknown option"),
                                 (["fitt"], 2, "no such subcommand; did you mean fit?"),
                                 (["tune", "--help"], 0, "usage: kiln tune lr")]:  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            main(argv)
        captured = capsys.readouterr()
        assert stop.value.code == code and expected in captured.out + captured.err, argv


@pytest.mark.parametrize("command", [["sweep"], ["multirun"], ["export"], ["tune", "lr"], ["infer"], ["serve"]])
def test_a_commands_help_imports_no_torch(command: list[str]) -> None:
    """`kiln export --help` took 3.3 s (5.7 on a loaded machine) importing torch and Lightning to print its options."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "kiln", *command, "--help"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and f"usage: kiln {' '.join(command)}" in done.stdout, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not {m for m in imported if m.split(".")[0] in ("torch", "lightning")}


def test_a_fit_without_its_test_ends_on_a_summary_naming_the_weights_to_test(capsys: pytest.CaptureFixture) -> None:
    """It printed nothing after the progress bar: no metric, no checkpoint, no run folder."""
    main(["fit", *LIMIT, "--run.test_after_fit", "false", "--trainer.logger", "false"])
    (run_dir,) = run_dirs()
    out = capsys.readouterr().out
    assert "val/loss" in out and "(last validation)" in out and f"run folder {run_dir}" in out
    assert f"kiln test --ckpt_path {run_dir}/checkpoints/best-" in out


def test_build_cli_in_a_notebook_draws_no_warning_about_the_kernels_own_arguments(
    monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    """A Jupyter kernel runs with its own ``sys.argv`` (``-f <connection file>``): LightningCLI warned, in every
    notebook that builds an experiment, that args and command-line arguments were both given."""
    kernel = ["ipykernel_launcher.py", "-f", "/tmp/kernel-1.json"]
    monkeypatch.setattr(sys, "argv", list(kernel))
    build_cli([*LIMIT, "--trainer.logger", "false"], run=False)
    assert not [w for w in recwarn if "intended to run from within Python" in str(w.message)]
    assert sys.argv == kernel


def test_the_model_summary_of_a_module_without_an_example_input_says_flops_were_not_counted(
    capsys: pytest.CaptureFixture,
) -> None:
    """Lightning printed "Total FLOPs: 0" (and 0 per layer) for a module it had no input to count them on."""
    build_cli(["fit", "--data", "probes.PlainDigits", "--model.init_args.num_classes", "10",
               "--model.init_args.net.init_args.in_channels", "1", "--trainer.fast_dev_run", "1",
               "--trainer.logger", "false"])  # fmt: skip
    out = capsys.readouterr().out
    assert "Total params: 56.6 K" in out and "Total FLOPs: 0" not in out and "┃ FLOPs ┃" not in out
    assert "Total FLOPs: not counted (the module has no example_input_array)" in out


def test_a_module_without_test_step_trains_says_it_was_not_tested_and_kiln_test_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Training ended in "internal error (MisconfigurationException: No `test_step()` method defined …); please
    report it" at the test after fit, and `kiln test` said the same."""
    args = [*LIMIT, "--model", "probes.Untested", "--trainer.logger", "false", "--run.root", str(tmp_path)]
    main(["fit", *args])
    out = capsys.readouterr().out
    assert "not tested: Untested has no test_step; kiln test needs it" in out and "val/loss" in out
    (run_dir,) = (tmp_path / "digits").iterdir()
    assert results.status(run_dir) == ("finished", "")
    with pytest.raises(SystemExit) as stop:
        main(["test", *args, "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt")])
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        "error: kiln test: Untested has no test_step; add it to evaluate a checkpoint on the test split"
    )
