"""Every kiln subcommand against bad input (missing, empty, truncated, wrong type, zero, negative, huge): a non-zero
exit with at most 3 lines on stderr, no traceback, nothing half-written, and no earlier result touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dataset_files import truncate, write_image_folder
from helpers import CONFIGS, LIMIT

from kiln.commands.boundary import main

LEFTOVERS = (".*.partial*", ".*.tmp", "*.partial")
CASES: list[tuple[str, list[str], int]] = [  # (name, kiln arguments, exit code)
    ("fit: missing -c file", ["fit", "-c", "nowhere.yaml"], 2),
    ("fit: empty -c file", ["fit", "-c", "empty.yaml"], 2),
    ("fit: -c file of Latin-1 bytes", ["fit", "-c", "latin.yaml"], 2),
    ("fit: -c file holding a list", ["fit", "-c", "list.yaml"], 2),
    ("fit: wrong type", ["fit", "--trainer.max_epochs", "many"], 2),
    ("fit: zero epochs", ["fit", "--trainer.max_epochs", "0"], 2),
    ("fit: negative batch size", ["fit", "--data.init_args.batch_size", "-4"], 2),
    ("fit: null for a float", ["fit", "--model.init_args.net.init_args.dropout=null"], 2),
    ("fit: missing checkpoint", ["fit", "--ckpt_path", "nowhere.ckpt"], 1),
    ("fit: truncated checkpoint", ["fit", "--ckpt_path", "truncated.ckpt"], 1),
    ("test: missing checkpoint", ["test", "--ckpt_path", "nowhere.ckpt"], 1),
    ("predict: truncated checkpoint", ["predict", "--ckpt_path", "truncated.ckpt"], 1),
    ("validate: best of no run", ["validate", "--ckpt_path", "best", "--run.name", "none"], 2),
    ("sweep: missing file", ["sweep", "-c", "nowhere.yaml"], 2),
    ("sweep: empty file", ["sweep", "-c", "empty.yaml"], 2),
    ("sweep: zero trials", ["sweep", "-c", "tiny.yaml", "--n_trials", "0"], 2),
    ("sweep: negative trials", ["sweep", "-c", "tiny.yaml", "--n_trials", "-1"], 2),
    ("sweep: unknown option", ["sweep", "-c", "tiny.yaml", "--trials", "3"], 2),
    ("sweep: corrupt study", ["sweep", "-c", "tiny.yaml", "--root", "corrupt"], 2),
    ("sweep: empty study", ["sweep", "-c", "tiny.yaml", "--root", "zero"], 2),
    ("multirun: empty seed range", ["multirun", "--seeds", "3-1"], 2),
    ("multirun: wrong seeds", ["multirun", "--seeds", "x"], 2),
    ("multirun: one fold", ["multirun", "--folds", "1"], 2),
    ("multirun: negative folds", ["multirun", "--folds", "-2"], 2),
    ("multirun: grid without values", ["multirun", "--grid", "lr"], 2),
    ("export: missing checkpoint", ["export", "--ckpt_path", "nowhere.ckpt", "--output", "out"], 1),
    ("export: truncated checkpoint", ["export", "--ckpt_path", "truncated.ckpt", "--output", "out"], 1),
    ("export: zero samples", ["export", "--ckpt_path", "good.ckpt", "--output", "out", "--samples", "0"], 2),
    ("export: negative batch size", ["export", "--ckpt_path", "good.ckpt", "--batch_sizes", "-1"], 2),
    ("export: unknown format", ["export", "--ckpt_path", "good.ckpt", "--format", "tflite"], 2),
    ("infer: missing model", ["infer", "--model", "nowhere.onnx", "images"], 2),
    ("infer: truncated model", ["infer", "--model", "served/model.onnx", "--output", "p.csv", "images"], 2),
    ("infer: zero batch size", ["infer", "--model", "good/model.onnx", "--batch_size", "0", "images"], 2),
    ("infer: no images", ["infer", "--model", "good/model.onnx", "empty-folder"], 2),
    ("convert: missing -c file", ["convert", "-c", "nowhere.yaml", "--output", "chunks"], 2),
    ("convert: empty -c file", ["convert", "-c", "empty.yaml", "--output", "chunks"], 2),
    ("diff: not run folders", ["diff", "nowhere", "elsewhere"], 2),
    ("tune: zero steps", ["tune", "lr", "--num_training", "0"], 2),
    ("tune: rates reversed", ["tune", "lr", "--min_lr", "1", "--max_lr", "0.1"], 2),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Earlier results (a trained run, its export) and bad files beside them."""
    root = tmp_path_factory.mktemp("project")
    cwd = Path.cwd()
    os.chdir(root)
    try:
        main(["fit", *LIMIT, "--trainer.logger", "false", "--run.test_after_fit", "false"])
        (run,) = Path("runs/digits").iterdir()
        shutil.copy(run / "checkpoints" / "last.ckpt", "good.ckpt")
        shutil.copy(run / "checkpoints" / "last.ckpt", "truncated.ckpt")
        truncate(Path("truncated.ckpt"))
        main(["export", "--ckpt_path", "good.ckpt", "--output", "good", "--format", "onnx", "--samples", "16"])
    finally:
        os.chdir(cwd)
    shutil.copytree(root / "good", root / "served")
    truncate(root / "served" / "model.onnx")
    write_image_folder(root / "images", classes=2, per_class=1)
    (root / "empty-folder").mkdir()
    (root / "empty.yaml").write_text("# nothing but a comment\n")
    (root / "latin.yaml").write_bytes("trainer:\n  max_epochs: 1  # café\n".encode("latin-1"))
    (root / "list.yaml").write_text("- trainer\n- model\n")
    (root / "tiny.yaml").write_text(f"name: tiny\nn_trials: 2\nargs: [-c, {CONFIGS / 'debug' / 'limit.yaml'}]\n"
                                    "space:\n  model.init_args.net.init_args.width: {choices: [8, 16]}\n")  # fmt: skip
    for folder, content in (("corrupt", b"not a database, " * 64), ("zero", b"")):
        (root / folder / "tiny").mkdir(parents=True)
        (root / folder / "tiny" / "study.db").write_bytes(content)
    return root


def fingerprint(root: Path) -> dict[str, tuple[int, int]]:
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()]
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


@pytest.mark.slow
def test_every_command_meets_bad_input_with_one_line_and_leaves_everything_as_it_was(
    project: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the kiln command's own entry point (kiln.commands.boundary.main), in this process: what a subprocess
    would print to its stderr, file descriptor included, is what capfd reads."""
    before = fingerprint(project)
    monkeypatch.chdir(project)
    capfd.readouterr()
    problems = []
    for name, args, code in CASES:
        try:
            main(args)
            exit_code: object = 0
        except SystemExit as stop:
            exit_code = stop.code
        stderr = capfd.readouterr().err
        lines = [line for line in stderr.splitlines() if line.strip()]
        if exit_code != code or len(lines) > 3 or "Traceback" in stderr or "internal error" in stderr:
            problems.append(f"{name}: exit {exit_code} (want {code}), {len(lines)} lines:\n{stderr[-600:]}")
    assert not problems, "\n\n".join(problems)
    assert fingerprint(project) == before  # no run folder, output or half-written file left, nothing earlier touched
    assert not [p for pattern in LEFTOVERS for p in project.rglob(pattern)]


@pytest.mark.slow
def test_the_real_process_says_the_same_one_line(
    project: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same boundary as a process of its own (not a fork): one case of each exit path, its stderr as a user sees
    it, line for line what the command said in this process."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    monkeypatch.chdir(project)
    paths = {"fit: -c file of Latin-1 bytes", "export: missing checkpoint"}  # a usage error (2), a file error (1)
    for name, args, code in [c for c in CASES if c[0] in paths]:
        capfd.readouterr()
        with pytest.raises(SystemExit):
            main(args)
        here = capfd.readouterr().err
        done = subprocess.run([sys.executable, "-m", "kiln", *args], cwd=project, capture_output=True, text=True,
                              env=env, timeout=300)  # fmt: skip
        assert done.returncode == code and done.stderr == here, (name, done.stderr, here)
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: "), (name, done.stderr)
