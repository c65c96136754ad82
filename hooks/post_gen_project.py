"""Turn the copied template into the new project: rename the research package and strip template-only parts.

Cookiecutter renders this file with the answers, then runs it inside the new project folder.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ENGINE = "kiln"  # the engine: never renamed, updated whole by `cruft update`
OLD = "research"  # the research package: becomes the project's own
# the package's name where code or a path names it (research.nets, src/research/, `research`, "research",
# import research), never the word in prose ("research code")
NAMED = re.compile(rf"(?<![\w.-]){OLD}(?=\.\w|/|`|\"|'|\s+import\b)|(?<=\bimport ){OLD}\b")
PACKAGE = "{{ cookiecutter.package_name }}"
SLUG = "{{ cookiecutter.project_slug }}"
# free text as JSON string literals (ASCII, every quote and backslash escaped): also valid Python literals,
# so no answer can break this file
# fmt: off
NAME = {{ cookiecutter.project_name | jsonify }}  # noqa: F821
AUTHOR = {{ cookiecutter.author | jsonify }}  # noqa: F821
DESCRIPTION = {{ cookiecutter.description | jsonify }}  # noqa: F821
# fmt: on


def whole(text: str) -> str:
    """JSON writes a character beyond U+FFFF (an emoji) as a surrogate pair, which Python keeps as two halves that
    UTF-8 cannot write: join them."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16")


NAME, AUTHOR, DESCRIPTION = whole(NAME), whole(AUTHOR), whole(DESCRIPTION)
TEMPLATE = "{{ cookiecutter._template | default('') }}"
OUTPUT_DIR = "{{ cookiecutter._output_dir | default('') }}"  # cruft sets neither

# what the template folder links to (see its symlinks), and what only the template needs
# (.gitignore travels as `gitignore`: git refuses a symlinked .gitignore)
LINKED = [".ci", ".devcontainer", ".dockerignore", ".env.example", ".github", "gitignore", ".pre-commit-config.yaml",
          "Dockerfile", "Makefile", "README.md", "benchmarks", "configs", "docs", "notebooks", "pyproject.toml",
          "scripts", "src", "tests", "uv.lock"]  # fmt: skip
# the engine's own suite, run in the template's CI, and the page on it
TEMPLATE_ONLY = ["tests/engine", "docs/development.md"]
TEXT_SUFFIXES = {
    ".py",
    ".toml",
    ".yaml",
    ".yml",
    ".md",
    ".lock",
    ".ipynb",
    ".sh",
    ".sbatch",
    ".cfg",
    ".txt",
    ".json",
    "",
}


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def template_root() -> Path | None:
    """The template checkout this project was generated from, if it can be found on disk."""
    candidates = [Path(TEMPLATE), Path(OUTPUT_DIR) / TEMPLATE]
    name = TEMPLATE.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    candidates.append(Path.home() / ".cookiecutters" / name)  # where cookiecutter clones a URL
    return next((p for p in candidates if (p / "cookiecutter.json").is_file()), None)


def restore_unlinked_entries() -> None:
    """Where git checked the template's symlinks out as plain files (core.symlinks=false), copy the real ones."""
    placeholders = [e for e in LINKED if Path(e).is_file() and Path(e).read_text(errors="ignore").strip() == f"../{e}"]
    if not placeholders:
        return
    root = template_root()
    if root is None:
        fail(f"this template checkout has symlinks turned off and its files were not found at {TEMPLATE!r}: "
             "clone it with `git clone -c core.symlinks=true` and generate from that folder")  # fmt: skip
    for entry in placeholders:
        Path(entry).unlink()
        source = root / (".gitignore" if entry == "gitignore" else entry)
        if source.is_dir():
            shutil.copytree(source, entry, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, entry)


def rewrite(path: Path) -> None:
    try:
        text = path.read_text()
    except UnicodeDecodeError:  # a binary file without a suffix (a cache copied from a working tree): no names in it
        return
    if path.name in ("pyproject.toml", "uv.lock"):  # the distribution's name
        text = re.sub(rf'^name = "{ENGINE}"$', f'name = "{SLUG}"', text, flags=re.MULTILINE)
    if path.name == "pyproject.toml":
        described = "description = " + json.dumps(DESCRIPTION, ensure_ascii=False)  # a TOML basic string
        text = re.sub(r"^description = .*$", lambda _: described, text, flags=re.MULTILINE)  # taken as it is
        author = "authors = [" + "{" + " name = " + json.dumps(AUTHOR) + " " + "}]"  # no double braces: Jinja
        text = text.replace('readme = "README.md"', 'readme = "README.md"\n' + author, 1)
    if path.suffix == ".md" and path.parent == Path("docs"):  # the README's pages: the template's lines go too
        text = re.sub(r"<!-- template-only -->.*?<!-- /template-only -->", "", text, flags=re.DOTALL)
        text = re.sub(r"^tests/engine/ .*\n", "", text, flags=re.MULTILINE)  # the layout's line for the engine's suite
    if path.name == "README.md" and path.parent == Path("."):
        body = re.sub(r"<!-- template-only -->.*?<!-- /template-only -->\n*", "", text, flags=re.DOTALL)
        body = re.sub(r"<!-- project-only\n(.*?)-->\n", r"\1", body, flags=re.DOTALL)  # shown in the project only
        body = re.sub(r"^tests/engine/ .*\n", "", body, flags=re.MULTILINE)  # the layout's line for the engine's suite
        text = f"# {NAME}\n\n{DESCRIPTION}\n\n" + body[body.index("## ") :]
    if path.name == "train.yaml":  # the W&B project the runs log to: the project's own
        text = re.sub(rf"^(\s+project:) {ENGINE}$", rf"\1 {SLUG}", text, flags=re.MULTILINE)
    path.write_text(NAMED.sub(PACKAGE, text))


def main() -> None:
    restore_unlinked_entries()
    Path("gitignore").rename(".gitignore")
    for leftover in [*Path(".").rglob("__pycache__"), *map(Path, TEMPLATE_ONLY)]:
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink(missing_ok=True)
    if PACKAGE != OLD:
        Path("src", OLD).rename(Path("src", PACKAGE))
    engine = Path("src", ENGINE)
    for path in sorted(Path(".").rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES and ".git" not in path.parts and engine not in path.parents:
            rewrite(path)
    print(f"Created {NAME} in {Path.cwd()}: `cd {SLUG} && git init && make install && make test`")


if __name__ == "__main__":
    main()
