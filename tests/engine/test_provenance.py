"""Every run explains itself: env.json (code, lockfile, versions, command line, data), code.diff, `kiln diff`,
secrets from .env used and recorded nowhere, and the container files checked statically."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from dataset_files import write_image_folder
from helpers import CONFIGS, LIMIT
from test_template import git

from kiln.cli import build_cli
from kiln.commands.boundary import main
from kiln.data.folder import FolderDataModule
from kiln.process.secrets import REDACTED
from kiln.runs.provenance import command_line, data_fingerprint
from research.data.digits import DigitsDataModule

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--trainer.logger", "false", "--run.test_after_fit", "false"]


def newest_run() -> Path:
    return sorted(Path("runs/digits").iterdir())[-1]


def test_env_json_records_the_commit_the_edit_the_lock_and_the_data(tmp_path: Path) -> None:
    (tmp_path / "notes.py").write_text("LR = 0.003\n")
    shutil.copy(ROOT / "uv.lock", tmp_path / "uv.lock")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "notes.py", "uv.lock")
    git(tmp_path, "commit", "-qm", "start")
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    main(["fit", *LIMIT, *QUIET, "--trainer.max_epochs", "1"])
    clean = json.loads((newest_run() / "env.json").read_text())
    assert clean["code"]["commit"] == head and clean["code"]["dirty"] is False
    assert not (newest_run() / "code.diff").exists()
    assert clean["lockfile"]["sha256"] == hashlib.sha256((tmp_path / "uv.lock").read_bytes()).hexdigest()
    assert clean["versions"]["torch"] and clean["versions"]["lightning"]
    assert clean["command"] == ["kiln", "fit", *LIMIT, *QUIET, "--trainer.max_epochs", "1"]
    assert set(clean["data"]["splits"]) == {"train", "val", "test"}

    (tmp_path / "notes.py").write_text("LR = 0.01\n")
    main(["fit", *LIMIT, *QUIET, "--trainer.max_epochs", "1"])
    dirty = json.loads((newest_run() / "env.json").read_text())
    assert dirty["code"]["commit"] == head and dirty["code"]["dirty"] is True
    assert "+LR = 0.01" in (newest_run() / "code.diff").read_text()
    assert dirty["data"] == clean["data"]  # the same data, the same fingerprint


def test_one_changed_byte_of_the_data_changes_its_fingerprint(tmp_path: Path) -> None:
    digits = DigitsDataModule()
    digits.setup("fit")
    before = data_fingerprint(digits)
    assert before["splits"]["train"]["how"] == "tensors, whole"
    digits.train_set.inputs.view(-1)[1234] += 1  # type: ignore[union-attr]
    after = data_fingerprint(digits)
    assert after["splits"]["train"]["sha256"] != before["splits"]["train"]["sha256"]
    assert after["splits"]["val"] == before["splits"]["val"]

    write_image_folder(tmp_path / "images", classes=2, per_class=10)
    folder = FolderDataModule(root=str(tmp_path / "images"), image_size=(8, 8))
    folder.setup("fit")
    before = data_fingerprint(folder)
    assert before["splits"]["train"]["how"] == "file names and sizes; bytes of every file"
    path = Path(folder.train_set.paths[0])  # type: ignore[union-attr]
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert data_fingerprint(folder)["splits"]["train"]["sha256"] != before["splits"]["train"]["sha256"]


def test_the_recorded_command_line_hides_every_secret() -> None:
    argv = ["kiln", "fit", "--model.init_args.api_key", "s1", "--model.init_args.token=s2", "--trainer.max_epochs", "3",
            "--model.init_args.settings", '{"password": "s3", "depth": 2}']  # fmt: skip
    shown = command_line(argv)
    assert "s1" not in shown and "--model.init_args.token=" + REDACTED in shown and "3" in shown
    assert not any("s3" in arg for arg in shown) and any('"depth": 2' in arg for arg in shown)


@pytest.mark.slow
def test_kiln_diff_names_the_config_environment_and_code_differences(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    main(["fit", *LIMIT, *QUIET, "--trainer.max_epochs", "1"])
    first = newest_run()
    main(["fit", *LIMIT, *QUIET, "--trainer.max_epochs", "1", "--model.init_args.optimizer.init_args.lr", "0.01",
          "-c", str(CONFIGS / "callbacks" / "early_stopping.yaml")])  # fmt: skip
    second = newest_run()
    (second / "code.diff").write_text("+planted\n")
    capsys.readouterr()
    main(["diff", str(first), str(second)])
    out = capsys.readouterr().out
    assert "model.init_args.optimizer.init_args.lr: 0.003 -> 0.01" in out
    # a callback added: one line with its arguments, not the whole list twice
    (added,) = [line for line in out.splitlines() if line.startswith("  trainer.callbacks")]
    assert added.startswith("  trainer.callbacks[EarlyStopping]: (unset) -> lightning.pytorch.callbacks.EarlyStopping(")
    assert "patience=5" in added and "ModelCheckpoint" not in added
    assert "command: ['kiln', 'fit'," in out  # the environment section: the command lines differ
    assert "uncommitted changes (code.diff): none -> 1 lines" in out
    with pytest.raises(SystemExit) as stop:
        main(["diff", str(first), str(tmp_path / "nowhere")])
    assert stop.value.code == 2 and "nowhere: not a run folder" in capsys.readouterr().err


def test_a_secret_in_dot_env_reaches_the_run_and_no_file_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("KILN_TEST_SERVICE_TOKEN", raising=False)
    (tmp_path / ".env").write_text(
        "# secrets\nexport KILN_TEST_SERVICE_TOKEN='dotenv-s3cr3t-value'\nWANDB_MODE=online\n"
    )
    cli = build_cli(["fit", *LIMIT])
    assert os.environ["KILN_TEST_SERVICE_TOKEN"] == "dotenv-s3cr3t-value"  # loaded for the run
    assert os.environ["WANDB_MODE"] == "offline"  # a variable already set wins
    monkeypatch.delenv("KILN_TEST_SERVICE_TOKEN")
    files = [p for p in Path(cli.trainer.default_root_dir).rglob("*") if p.is_file()]
    assert any(p.name == "env.json" for p in files) and any(p.suffix == ".wandb" for p in files)
    assert not [p for p in files if b"dotenv-s3cr3t" in p.read_bytes()]


def test_the_dockerfile_passes_hadolint_and_installs_from_the_lock_as_a_user_without_root_with_one_cuda_base() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    stages = [line.split() for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert [s[-1] for s in stages] == ["uv", "build", "runtime", "dev", "serve"]  # multi-stage
    assert dockerfile.count("nvidia/cuda:") == 1 and dockerfile.count("${BASE_IMAGE}") == 2  # named in one place
    assert "uv sync --locked --no-dev --all-extras --no-editable" in dockerfile
    runtime = dockerfile.split("AS runtime")[1].split("FROM ")[0]
    user = [line for line in runtime.splitlines() if line.startswith("USER ")]
    assert user == ["USER 10001:10001"]
    assert {".venv/", "data/", "runs/", ".env"} <= set((ROOT / ".dockerignore").read_text().split())
    container = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())
    assert container["build"] == {"dockerfile": "../Dockerfile", "context": "..", "target": "dev"}
    assert (ROOT / ".env.example").is_file() and ".env" in (ROOT / ".gitignore").read_text().split()


SERVED_IMPORTS = {"numpy", "pillow", "jsonargparse"}  # the main dependencies `kiln serve` imports (test_serve.py)


def test_the_serve_image_installs_the_serve_extra_from_the_lock_without_torch_or_any_training_dependency() -> None:
    """Every main dependency `kiln serve` does not import is pruned, so a new one cannot slip into the image."""
    uv = shutil.which("uv") or str(Path(site.getuserbase()) / "bin" / "uv")
    if not Path(uv).is_file():
        pytest.skip("needs uv (make install puts it on the user's PATH)")
    stage = (ROOT / "Dockerfile").read_text().split("AS serve")[1]
    export = re.search(r"uv export (.*?) &&", stage.replace("\\\n", " "), re.DOTALL)
    assert export is not None
    flags = [f for f in export.group(1).split() if f not in ("--output-file", "/tmp/serve.txt")]
    done = subprocess.run([uv, "export", *flags], cwd=ROOT, capture_output=True, text=True, check=True)
    names = {re.split(r"[=;\[ ]", line)[0].lower() for line in done.stdout.splitlines() if line and line[0].isalpha()}
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    main = {re.split(r"[<>=\[ ]", d)[0].lower() for d in listed}
    pruned = {flags[i + 1] for i, f in enumerate(flags) if f == "--prune"}
    assert pruned == main - SERVED_IMPORTS
    assert {"litserve", "onnxruntime", "python-multipart", *SERVED_IMPORTS} <= names
    assert not names & {"torch", "torchvision", "lightning", "wandb", "nvidia-cublas-cu12", "triton"}
