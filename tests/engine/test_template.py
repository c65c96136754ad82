"""This repository is a cookiecutter template: generation, the generated project's tests, updates with cruft."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

for needed in ("cookiecutter", "cruft"):
    pytest.importorskip(needed, reason="needs the dev group's template tools (make install)")

ROOT = Path(__file__).resolve().parents[2]
LINK_DIR = "{{cookiecutter.project_slug}}"
ANSWERS = {"project_name": "Retina Scan", "author": 'Ada "L" Byron', "description": "Finds things in retinas."}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def snapshot(dest: Path) -> Path:
    """This working tree as a fresh one-commit git repo: tracked files as they are now, and untracked (not
    ignored) files inside folders; an untracked file at the top level is a user's scratch file, not template."""
    tracked = git(ROOT, "ls-files", "--cached", "-z").split("\0")
    untracked = git(ROOT, "ls-files", "--others", "--exclude-standard", "-z").split("\0")
    for name in filter(None, [*tracked, *(n for n in untracked if "/" in n)]):
        source, target = ROOT / name, dest / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "template")
    return dest


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return snapshot(tmp_path_factory.mktemp("template"))


def generate(template: Path, out: Path) -> Path:
    """A project generated from ``template`` into ``out`` with the test answers; its folder."""
    from cookiecutter.main import cookiecutter

    return Path(cookiecutter(str(template), no_input=True, extra_context=ANSWERS, output_dir=str(out)))


@pytest.fixture(scope="module")
def project(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(template, tmp_path_factory.mktemp("generated"))


def test_every_top_level_entry_is_linked_or_template_only(template: Path) -> None:
    """Each tracked top-level file or folder reaches generated projects through the link folder."""
    linked = {p.name for p in (template / LINK_DIR).iterdir()}
    assert all((template / LINK_DIR / name).is_symlink() for name in linked)
    top = {p.name for p in template.iterdir()} - {".git"}
    template_only = {LINK_DIR, "cookiecutter.json", "hooks"}
    assert top - template_only == (linked - {"gitignore"}) | {".gitignore"}


def tree(folder: Path) -> dict[str, bytes]:
    files = [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


def test_generation_renames_the_research_package_and_leaves_the_engine_whole(template: Path, project: Path) -> None:
    assert project.name == "retina-scan"
    package = project / "src" / "retina_scan"
    assert (package / "models" / "classifier.py").is_file() and not (project / "src" / "research").exists()
    assert tree(project / "src" / "kiln") == tree(template / "src" / "kiln")  # the engine: as the template has it
    for leftover in ("cookiecutter.json", "hooks", LINK_DIR, "gitignore", "tests/engine"):
        assert not (project / leftover).exists()
    assert (project / ".gitignore").is_file() and (project / "notebooks" / "quickstart.ipynb").is_file()
    named = re.compile(r"(?<![\w.-])research(?=\.\w|/|`|\"|'|\s+import\b)|(?<=\bimport )research\b")
    mentions = [p for p in project.rglob("*") if p.is_file() and named.search(p.read_text(errors="ignore"))]
    assert mentions == []
    readme = (project / "README.md").read_text()
    assert readme.startswith("# Retina Scan\n\nFinds things in retinas.\n")
    assert "tests/engine" not in readme and "10 min" not in readme and "-->" not in readme  # the template's own
    assert "`make test` runs this project's own tests" in readme  # what its make test does: the project's part
    pages = [page.read_text() for page in (project / "docs").glob("*.md")]  # not the template's development page
    assert len(pages) >= 7 and not [page for page in pages if "tests/engine" in page or "-->" in page]
    assert not (project / "docs" / "development.md").exists()
    pyproject = (project / "pyproject.toml").read_text()
    assert 'name = "retina-scan"' in pyproject and 'kiln = "kiln.__main__:main"' in pyproject
    assert '"src/kiln", "src/retina_scan"' in pyproject
    assert 'authors = [{ name = "Ada \\"L\\" Byron" }]' in pyproject
    train = (project / "configs" / "train.yaml").read_text()
    assert "class_path: retina_scan.nets.SmallCNN" in train and "project: retina-scan" in train
    assert "kiln fit" in (project / "Makefile").read_text()


def test_every_path_and_make_target_a_generated_readme_names_is_the_projects(project: Path) -> None:
    """Its contents linked docs/development.md, a template-only page; its make mutants refused in the project."""
    text = "\n".join(page.read_text() for page in [project / "README.md", *sorted((project / "docs").glob("*.md"))])
    makefile = (project / "Makefile").read_text()
    for target in set(re.findall(r"(?<![\w/.-])make ([a-z][\w-]*)", text)):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)*)", makefile, re.MULTILINE)
        assert recipe and "tests/engine" not in recipe.group(1), f"make {target}"  # there, and needs no template
    yours = ("my_signals",)  # what the README has a reader write
    for path in set(re.findall(r"(?<![\w/.$-])((?:src|configs|tests|notebooks|scripts|docs|benchmarks)/[\w./-]*\w)",
                                text)):  # fmt: skip
        assert (project / path).exists() or any(name in path for name in yours), path


@pytest.mark.slow
@pytest.mark.long
def test_a_generated_projects_make_install_and_make_test_pass(template: Path, tmp_path: Path) -> None:
    """The project's own `make install` (its own .venv, from uv's cache: no network) and `make test`, as its user
    runs them, on a machine where Python writes its bytecode caches (the template's own CI installs where it does
    not); the test once stood this environment in for `make install`."""
    project = generate(template, tmp_path)  # its own: the module's project stays without a .venv
    left = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTEST_CURRENT_TEST", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in left}
    done = subprocess.run(["make", "install"], cwd=project, env={**env, "UV_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    kiln = subprocess.run([str(project / ".venv" / "bin" / "kiln"), "fit", "--print_config"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert kiln.returncode == 0 and "retina_scan.data.DigitsDataModule" in kiln.stdout, kiln.stderr[-2000:]
    done = subprocess.run(["make", "test"], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"\d+ passed", done.stdout) and " error" not in done.stdout.splitlines()[-1]


def test_generation_works_where_git_checks_symlinks_out_as_files(tmp_path: Path) -> None:
    from cookiecutter.main import cookiecutter

    template = snapshot(tmp_path / "nolinks")
    for link in (template / LINK_DIR).iterdir():  # what `git clone -c core.symlinks=false` leaves
        target = os.readlink(link)
        link.unlink()
        link.write_text(target)
    out = Path(cookiecutter(str(template), no_input=True, extra_context=ANSWERS, output_dir=str(tmp_path / "out")))
    assert (out / "src" / "retina_scan" / "models" / "classifier.py").is_file() and (out / "src" / "kiln").is_dir()
    assert (out / "Makefile").read_text().startswith("# Run `make`")
    assert not (out / "src" / "retina_scan" / "__pycache__").exists()


@pytest.mark.slow
def test_cruft_update_brings_template_changes_and_keeps_user_edits(template: Path, tmp_path: Path) -> None:
    import cruft

    cruft.create(str(template), output_dir=tmp_path, no_input=True, extra_context=ANSWERS)
    project = tmp_path / "retina-scan"
    assert (project / ".cruft.json").is_file()
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "generated")
    # the user edits their project ...
    config = project / "configs" / "train.yaml"
    config.write_text(config.read_text().replace("max_epochs: 30", "max_epochs: 12"))
    git(project, "commit", "-qam", "fewer epochs")
    # ... while the template gains a feature
    cnn = template / "src" / "research" / "nets" / "cnn.py"
    cnn.write_text(cnn.read_text() + '\n\nFEATURE = "from research.nets, later"\n')
    engine = template / "src" / "kiln" / "errors.py"
    engine.write_text(engine.read_text() + '\n\nFEATURE = "from kiln, later"\n')
    git(template, "commit", "-qam", "template change")

    assert cruft.update(project, cookiecutter_input=False, skip_apply_ask=True)
    updated = (project / "src" / "retina_scan" / "nets" / "cnn.py").read_text()
    assert 'FEATURE = "from retina_scan.nets, later"' in updated  # arrived, renamed like the rest
    assert 'FEATURE = "from kiln, later"' in (project / "src" / "kiln" / "errors.py").read_text()  # the engine whole
    assert "max_epochs: 12" in config.read_text()  # the user's edit survived


@pytest.mark.parametrize(
    ("project_name", "folder", "package"),
    [("Über Net 2", "uber-net-2", "uber_net_2"), ("2 Fast", "2-fast", "p2_fast"),
     ("Retina.Scan", "retina-scan", "retina_scan")],
)  # fmt: skip
def test_any_project_name_gives_a_valid_folder_and_package(
    template: Path, tmp_path: Path, project_name: str, folder: str, package: str
) -> None:
    from cookiecutter.main import cookiecutter

    made = Path(cookiecutter(str(template), no_input=True, extra_context={"project_name": project_name},
                             output_dir=str(tmp_path)))  # fmt: skip
    assert made.name == folder and (made / "src" / package / "__init__.py").is_file()
    assert f'name = "{folder}"' in (made / "pyproject.toml").read_text()


@pytest.mark.parametrize(
    ("answers", "why"),
    [(["package_name=My-Pkg"], "must be a lowercase ASCII Python identifier"),
     (["package_name=import"], "is a Python keyword"), (["project_name=Class"], "'class' is a Python keyword"),
     (["package_name=json"], "is a module of Python's standard library"),
     (["project_name=Test"], "'test' is a module of Python's standard library"),
     (["project_name=Torch"], "'torch' is a package this project imports")],
    ids=["not_an_identifier", "keyword", "derived_keyword", "stdlib", "derived_stdlib", "dependency"],
)  # fmt: skip
def test_a_package_name_that_cannot_work_is_refused_before_generation(
    template: Path, tmp_path: Path, answers: list[str], why: str
) -> None:
    cmd = [sys.executable, "-m", "cookiecutter", str(template), "--no-input", "-o", str(tmp_path), *answers]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0
    printed = done.stderr + done.stdout
    (line,) = [line for line in printed.splitlines() if line.startswith("error:")]
    assert why in line and "package_name" in line
    assert "Traceback" not in printed  # cookiecutter's log of a failed hook, quietened by hooks/quiet_failure.py
    # the hook's line, then cookiecutter's own (its CLI echoes the failure); its "Stopping generation" log is dropped
    assert [line for line in printed.splitlines() if line.strip()][1:] == ["Hook script failed (exit status: 1)"]
    assert list(tmp_path.iterdir()) == []  # nothing generated


def test_any_description_is_accepted_as_written(template: Path, tmp_path: Path) -> None:
    from cookiecutter.main import cookiecutter

    # was re.error (bad escape \u), then a UnicodeEncodeError traceback for a character beyond U+FFFF (an emoji)
    description = "Détection d'objets — «rétine» 網膜 ''' \\u00e9 \"quoted\" \\ back 🔥"
    made = Path(cookiecutter(str(template), no_input=True, output_dir=str(tmp_path),
                             extra_context={"project_name": "Retina", "description": description}))  # fmt: skip
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    assert tomllib.loads((made / "pyproject.toml").read_text())["project"]["description"] == description
    assert description in (made / "README.md").read_text()


def test_a_project_name_too_long_for_a_folder_makes_a_folder_of_64_characters(template: Path, tmp_path: Path) -> None:
    """A 300-character project name ended in cookiecutter's traceback (OSError: File name too long)."""
    from cookiecutter.main import cookiecutter

    answers = {**ANSWERS, "project_name": "Retina Scan " * 25}
    out = Path(cookiecutter(str(template), no_input=True, extra_context=answers, output_dir=str(tmp_path)))
    assert len(out.name) <= 64 and out.name.startswith("retina-scan-retina-scan") and not out.name.endswith("-")
    assert (out / "src" / out.name.replace("-", "_") / "models" / "classifier.py").is_file()
