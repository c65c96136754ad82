"""Every command in README.md's code blocks runs as written (shortened by a preset where the README's run is
long), in README order, in a project folder of its own; a command this file has no rule for fails the test,
so the README cannot drift from what works."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import forkserver
import pytest
import yaml
from dataset_files import write_image_folder, write_mnist
from helpers import PROBES
from test_template import snapshot

ROOT = Path(__file__).resolve().parents[2]
LIMIT = "-c configs/debug/limit.yaml"  # a short, complete run
TINY = "-c configs/debug/fast_dev_run.yaml"  # one batch a stage: for commands that train many runs
# commands that share files run in README order in one lane; the lanes run side by side
LANES = {"mnist": "mnist", "sweep": "sweep", "multirun": "multirun", "convert|streaming": "streaming",
         "cookiecutter|cruft": "template", "digits|^make train|<file>": "digits"}  # fmt: skip
LINKED = ["Makefile", "configs", "src", ".venv", "pyproject.toml", "uv.lock", "scripts", "benchmarks", "notebooks",
          "README.md", "docs"]  # fmt: skip
PAGES = [
    "README.md",
    "docs/data.md",
    "docs/running.md",
    "docs/contracts.md",
    "docs/wandb.md",
    "docs/serving.md",
    "docs/many-runs.md",
    "docs/scaling.md",
    "docs/faults.md",
    "docs/layout.md",
    "docs/development.md",
]  # in reading order

Rule = Callable[[str, Path], "str | None"]  # the command to run for a README line (None: not run, see SKIPPED)


def pages_text() -> str:
    """README.md and the docs pages it links, one after the other."""
    return "\n".join((ROOT / page).read_text() for page in PAGES)


def readme_commands() -> list[str]:
    """The commands of the bash blocks of README.md and its docs pages, continuation lines joined, comments
    dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", pages_text(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.split(r"(?:^|\s)#", line)[0].strip()  # a shell comment starts at " #"
            if command:
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def newest(project: Path, pattern: str) -> str:
    """The newest file matching ``pattern`` under the project (a checkpoint an earlier command wrote)."""
    found = sorted(project.glob(pattern), key=lambda p: p.stat().st_mtime)
    assert found, f"no {pattern} in {project}: an earlier README command should have written it"
    return str(found[-1].relative_to(project))


def kiln(command: str) -> str:
    """``kiln …`` as the README writes it after `source .venv/bin/activate`: the project's own."""
    return re.sub(r"^kiln ", ".venv/bin/kiln ", command)


def launch(
    argv: list[str], project: Path, env: dict[str, str], whole: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run a README command in ``project``: ``.venv/bin/kiln …`` as ``python -m kiln …`` forked from the preloaded
    server (the same entry point, arguments, folder and environment; tests/engine/test_cli.py starts the installed
    script itself), ``make train|sweep`` as the kiln command its recipe expands to, forked too, unless ``whole``
    (make, ``uv run`` and the ``kiln`` script: the README's first ``make train``), anything else (make, uv,
    cookiecutter) as a process of its own."""
    if argv[:2] in (["make", "train"], ["make", "sweep"]) and not whole:
        argv = made(argv, project, env)
    if argv[0] == ".venv/bin/kiln":
        argv = [sys.executable, "-m", "kiln", *argv[1:]]
    return forkserver.run(argv, cwd=project, capture_output=True, text=True, env=env, timeout=600)


def made(argv: list[str], project: Path, env: dict[str, str]) -> list[str]:
    """The ``kiln`` command a make target's recipe runs (``make -n``: make expands the variables, runs nothing)."""
    recipe = subprocess.run(["make", "-n", "--no-print-directory", *argv[1:]], cwd=project, capture_output=True,
                            text=True, env=env, check=True)  # fmt: skip
    words = shlex.split(recipe.stdout.strip())  # <uv> run --no-sync kiln <arguments>
    start = next((i + 3 for i in range(len(words)) if words[i : i + 3] == ["run", "--no-sync", "kiln"]), None)
    assert start is not None, f"`{' '.join(argv)}` runs `{recipe.stdout.strip()}`, not uv's kiln"
    return [".venv/bin/kiln", *words[start:]]


def template(command: str, project: Path) -> str:
    if not (project / "template-copy").is_dir():
        snapshot(project / "template-copy")  # this working tree as a template repository
    tool = "cookiecutter" if "cookiecutter" in command else "cruft"
    answer = f"--no-input -o made-by-{tool}" if tool == "cookiecutter" else f"--no-input --output-dir made-by-{tool}"
    return command.replace("<template-url-or-path>", f"template-copy {answer}").replace(
        "python3 ", f"{sys.executable} ", 1
    )


# README line (a regular expression) -> how it runs here; the first that matches applies
RUN: list[tuple[str, Rule]] = [
    (r"^python3 -m (cookiecutter|cruft create) <template-url-or-path>$", template),
    (r"^make train$", lambda c, p: f"{c} DEBUG=limit"),
    (r"^make train EXP=mnist$", lambda c, p: f"{c} DEBUG=limit"),  # tests' MNIST files: no download
    (r"^make train LOGGER=csv DEBUG=limit$", lambda c, p: c),
    (r"^make train ARGS=", lambda c, p: c.replace('ARGS="', 'DEBUG=limit ARGS="')),
    (r"^\.venv/bin/kiln fit --help$", lambda c, p: c),
    (r"--print_config$", lambda c, p: c),
    (r"^\.venv/bin/kiln predict --ckpt_path runs/digits/<run>/", lambda c, p: c.replace(
        "runs/digits/<run>/checkpoints/last.ckpt", newest(p, "runs/digits/2*/checkpoints/last.ckpt"))),
    (r"^kiln convert ", lambda c, p: kiln(c)),
    (r"^kiln fit -c configs/data/streaming.yaml", lambda c, p: f"{kiln(c)} {LIMIT}"),
    (r"^make sweep SWEEP=digits$", lambda c, p: f'{c} ARGS="--n_trials 2 -- {TINY}"'),
    (r"^kiln sweep .* --report$", lambda c, p: kiln(c)),
    (r"^kiln sweep .* --n_trials 2 -- -c configs/debug/limit.yaml$", lambda c, p: kiln(c)),
    (r"^kiln multirun ", lambda c, p: kiln(c) + (f" {TINY}" if " -- " in c else f" -- {TINY}")),
    (r"^kiln predict --ckpt_path runs/mnist/<run>/", lambda c, p: kiln(c).replace(
        "runs/mnist/<run>/checkpoints/best-….ckpt", newest(p, "runs/mnist/2*/checkpoints/best-*.ckpt"))),
    (r"^kiln test --ckpt_path best -c configs/experiment/mnist.yaml$", lambda c, p: f"{kiln(c)} {LIMIT}"),
    (r"^kiln predict --ckpt_path <file> ", lambda c, p: kiln(c).replace(
        "<file>", newest(p, "runs/digits/2*/checkpoints/last.ckpt"))),
    (r"^kiln diff runs/digits/<run-a> runs/digits/<run-b>$", lambda c, p: kiln(c).replace(
        "runs/digits/<run-a> runs/digits/<run-b>", " ".join(str(Path(f).parent.parent) for f in sorted(
            p.glob("runs/digits/2*/checkpoints/last.ckpt"))[-2:]))),
    (r"^kiln tune lr -- ", lambda c, p: kiln(c) + " --trainer.limit_train_batches 5"),
    (r"^kiln fit -c configs/experiment/digits.yaml -c runs/digits/<tune>/tuned.yaml$", lambda c, p: kiln(c).replace(
        "runs/digits/<tune>", str(Path(newest(p, "runs/digits/tune-*/tuned.yaml")).parent)) + f" {LIMIT}"),
    (r"^make (install|test|test-fast|test-gpu|lint|format|typecheck|bench|gpu-check|mutants)$", lambda c, p: c.replace(
        "make ", "make -n ", 1)),  # the target exists and resolves (CI runs them: .ci/run, ci.yml)
]  # fmt: skip
SKIPPED = {  # README line -> why it does not run here
    r"^docker ": "builds or runs a container image (tests/engine/test_provenance.py checks the Dockerfile statically)",
    r"^python3 -m pip install ": "installs from PyPI (no network in tests)",
    r"^kiln serve |^curl ": "starts or asks a server (tests/engine/test_serve.py serves each example's checkpoint)",
    r"gpu\.yaml|TRAINER=gpu": "needs a CUDA GPU (tests/engine/test_trainer_features.py's GPU tests)",
    r"research\.nets\.Timm .*weights hub": "fetches pretrained weights "
    "(tests/engine/test_pretrained.py loads them from a local cache)",
    r"^\.venv/bin/cruft update$": "needs a project generated from a template with a later commit "
    "(tests/engine/test_template.py::test_cruft_update_brings_template_changes_and_keeps_user_edits)",
}


def plan(command: str) -> Rule | str:
    """The rule that runs ``command``, or why it is skipped; a command with neither fails the test."""
    for pattern, reason in SKIPPED.items():
        if re.search(pattern, command):
            return reason
    for pattern, rule in RUN:
        if re.search(pattern, command):
            return rule
    raise AssertionError(f"README.md: no rule in tests/engine/test_readme.py runs or skips `{command}`: add one")


def test_the_sweep_file_the_readme_shows_is_the_shipped_one() -> None:
    """The README's copy had lost the shipped file's weight_decay range."""
    shown = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", pages_text(), re.DOTALL)]
    (readme,) = [b for b in shown if isinstance(b, dict) and b.get("name") == "digits" and "space" in b]
    shipped = yaml.safe_load((ROOT / "configs" / "sweep" / "digits.yaml").read_text())
    assert {key: readme.get(key) for key in shipped} == shipped  # every key the file has, as the file has it


def test_every_file_size_the_pages_state_is_the_file_s() -> None:
    """The README called the regressor 70 lines and said it saved with `save_hyperparameters`: it had grown to 79
    lines around `save_config`."""
    stated = re.findall(r"`(research/[\w/]+\.py)` \((\d+) lines\)", pages_text())
    assert stated  # the claims were found
    for path, lines in stated:
        assert len((ROOT / "src" / path).read_text().splitlines()) == int(lines), path


def test_every_readme_command_has_a_rule() -> None:
    commands = readme_commands()
    assert len(commands) > 20  # the blocks were found
    for command in commands:
        plan(command)


@pytest.mark.slow
@pytest.mark.long
def test_every_readme_command_runs_as_written_or_shortened_and_each_make_target_resolves(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in LINKED:
        (project / name).symlink_to(ROOT / name)
    write_mnist(project / "data" / "MNIST" / "raw", n_train=96, n_test=48, seed=0)
    write_image_folder(project / "data" / "images", classes=3, per_class=12)
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    lanes: dict[str, list[tuple[str, Rule]]] = {}
    for command in readme_commands():
        rule = plan(command)
        if not isinstance(rule, str):
            lane = next((name for pattern, name in LANES.items() if re.search(pattern, command)), "other")
            lanes.setdefault(lane, []).append((command, rule))

    def run_lane(commands: list[tuple[str, Rule]]) -> list[str]:
        failures = []
        for command, rule in commands:
            try:  # a rule that finds no earlier output fails this command, and the lane's earlier failures still show
                runnable = rule(command, project)
            except AssertionError as error:
                failures.append(f"`{command}`: {error}")
                continue
            assert runnable is not None
            done = launch(shlex.split(runnable), project, env, whole=command == "make train")
            if done.returncode:
                failures.append(f"`{command}` (run as `{runnable}`) exited {done.returncode}:\n"
                                f"{done.stdout[-1500:]}\n{done.stderr[-3000:]}")  # fmt: skip
        return failures

    with ThreadPoolExecutor(max_workers=3) as pool:
        failures = [f for found in pool.map(run_lane, lanes.values()) for f in found]
    assert not failures, "\n\n".join(failures)


def _slug(heading: str) -> str:
    """A heading's anchor as the forge makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # a `# comment` in a code block is no heading
    return {_slug(heading) for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_every_link_of_the_readme_and_its_pages_reaches_its_file_and_heading() -> None:
    """The README's sections moved to docs/ pages: a link to a file or an anchor that is not there fails here."""
    pages = [ROOT / page for page in PAGES] + [ROOT / "benchmarks" / "README.md"]
    assert sorted(ROOT.glob("docs/*.md")) == sorted(p for p in pages if p.parent.name == "docs")  # each page read
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:: not this test's to reach
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
