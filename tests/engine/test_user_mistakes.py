"""A user's mistake is one line that says what and where, never kiln's "internal error … please report it"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest
from helpers import LIMIT

# a user's module: each class makes one mistake (the line numbers are asserted below)
MINE = """from kiln.data import seeded_split
from research.data import DigitsDataModule
from research.models import Classifier


class BadData(DigitsDataModule):
    def __init__(self, batch_size: int = 64) -> None:
        super().__init__(batch_size=batch_size)
        [][1]


class BadModel(Classifier):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        {}["missing"]


class BadSplit(DigitsDataModule):
    def setup(self, stage: str) -> None:
        seeded_split(10, (1.5, 0.1), 0)


class BadColumns(Classifier):
    def prediction_columns(self, prediction, batch):
        return {"a": list(range(len(prediction))), "b": list(range(len(prediction) - 1))}


class FewNames(DigitsDataModule):
    class_names = ("zero", "one", "two")
"""
QUIET = [*LIMIT, "--trainer.logger", "false", "--run.test_after_fit", "false"]
SRC = Path(__file__).resolve().parents[2] / "src"


def kiln(folder: Path, *args: str) -> tuple[int, str]:
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)  # its module, and kiln's
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": path}
    done = forkserver.run([sys.executable, "-m", "kiln", *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    return done.returncode, done.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's module, and a checkpoint of two epochs trained with its BadColumns model."""
    folder = tmp_path_factory.mktemp("mine")
    (folder / "mine.py").write_text(MINE)
    code, err = kiln(folder, "fit", *QUIET, "--model", "mine.BadColumns", "--run.name", "cols")
    assert code == 0, err[-2000:]
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["fit", *QUIET, "--data", "mine.BadData"],
         "IndexError: list index out of range (raised in your code: {mine}:9, in __init__)"),
        (["fit", *QUIET, "--model", "mine.BadModel"],
         "KeyError: 'missing' (raised in your code: {mine}:15, in __init__)"),
        (["fit", *QUIET, "--data", "mine.BadSplit"],
         "seeded_split(10, (1.5, 0.1), 0): the fractions must each be in [0, 1] and add up to at most 1"),
        (["fit", *QUIET, "--model.init_args.scheduler.init_args.warmup_fraction", "5"],
         "WarmupCosineLR: warmup_fraction 5.0 must be in [0, 1)"),
        (["fit", *QUIET, "--trainer.strategy", "fsdp"], "--trainer.strategy asks for FSDP"),
        (["predict", "--ckpt_path", "{last}"],
         "for a batch of 64 samples, BadColumns's columns have other lengths (b: 63)"),
        (["fit", *QUIET, "--model", "mine.BadColumns", "--ckpt_path", "{last}", "--trainer.max_epochs", "1"],
         "--trainer.max_epochs 1: the checkpoint {last} has trained 2 epochs already; give at least 2"),
        (["fit", *QUIET, "--data", "mine.FewNames"], "FewNames declares 10 classes and 3 class_names (zero, one, two)"),
        (["multirun", "--root", "", "--", *QUIET], "kiln multirun: argument --root: an empty folder"),
        (["sweep", "-c", "any.yaml", "--root", " "], "kiln sweep: argument --root: an empty folder"),
        (["fit", "-c", ""], "-c: an empty file name: give a YAML file, or leave -c out"),
        (["fit", "--non_finite.max_skips", "ten"], "--non_finite.max_skips: 'ten' given, expected int"),
    ],
    ids=["data_init", "model_init", "kiln_helper_misused", "scheduler_value", "fsdp_on_cpu", "prediction_columns",
         "resume_with_fewer_epochs", "class_names_for_fewer_classes", "multirun_into_an_empty_root",
         "sweep_into_an_empty_root", "empty_config_file_name", "kilns_own_option_of_the_wrong_type"],
)  # fmt: skip
def test_a_users_mistake_is_one_line_naming_it_and_never_an_internal_error(
    folder: Path, args: list[str], expected: str
) -> None:
    """Each was "internal error (…); please report it" or said less than this (`Unexpected config:`, `Expected a
    <class 'int'>`, exit 0 into ./multirun): jsonargparse's "Does not validate against any of the Union
    subtypes" for an exception in a user class's __init__, Lightning's ValueError for FSDP on a CPU and its
    MisconfigurationException for a resume with fewer epochs, an IndexError in the prediction writer."""
    (last,) = folder.glob("runs/cols/*/checkpoints/last.ckpt")
    names = {"mine": str(folder / "mine.py"), "last": str(last)}
    code, err = kiln(folder, *(a.format(**names) for a in args))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, err[-2000:]
    assert expected.format(**names) in errors[0] and "internal error" not in err and "Traceback" not in err, errors
    assert not (folder / "multirun").exists()  # an empty --root trained into ./multirun, with exit 0
    if "seeded_split" in expected:
        assert f"(called from your code: {names['mine']}:20, in setup)" in errors[0]


@pytest.mark.slow
def test_in_a_non_editable_install_an_error_in_the_research_package_is_the_users(tmp_path: Path) -> None:
    """The Dockerfile installs the project with `uv sync --no-editable`: the research package sits among the
    libraries, and each error it raised was "internal error … please report it" (or named a library's line)."""
    import torch

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python*/site-packages")
    for package in ("kiln", "research"):  # as the wheel lays them out
        shutil.copytree(SRC / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(SRC.parent / "configs", site / "kiln" / "configs")  # the wheel's force-include
    record = site / "kiln-0.1.0.dist-info"
    record.mkdir()
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln\nVersion: 0.1.0\n")
    (record / "top_level.txt").write_text("kiln\nresearch\n")
    (site / "libraries.pth").write_text(f"{Path(torch.__file__).parents[1]}\n")  # torch, Lightning, ... as they are
    (site / "research" / "data" / "mistake.py").write_text(
        "from research.data import DigitsDataModule\n\n\nclass Mistaken(DigitsDataModule):\n"
        "    def setup(self, stage: str) -> None:\n        raise ValueError('a mistake of the research code')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {"WANDB_MODE": "disabled"}
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "kiln", "fit", *QUIET, "--data",
                           "research.data.mistake.Mistaken"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-2000:]
    where = f"raised in your code: {(site / 'research' / 'data' / 'mistake.py').resolve()}:6, in setup"
    assert "ValueError: a mistake of the research code" in errors[0] and where in errors[0], errors
