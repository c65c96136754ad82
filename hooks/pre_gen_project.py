"""Refuse a package name that cannot work, before anything is generated: typed, or derived from the project name."""

from __future__ import annotations

import keyword
import re
import sys

PACKAGE = "{{ cookiecutter.package_name }}"
SLUG = "{{ cookiecutter.project_slug }}"
# what the project imports (and its tests), the engine kiln among them: a package of the same name would shadow it
TAKEN = {"kiln", "torch", "torchvision", "lightning", "pytorch_lightning", "lightning_utilities", "jsonargparse",
         "torchmetrics", "wandb", "rich", "pil", "numpy", "tensorboard", "optuna", "timm", "datasets", "litdata",
         "onnx", "onnxruntime", "onnxscript", "yaml", "pytest", "cookiecutter", "cruft", "mlflow", "tests"}  # fmt: skip


def problem() -> str | None:
    if not (PACKAGE.isidentifier() and PACKAGE.islower() and PACKAGE.isascii()):
        return f"package_name {PACKAGE!r} must be a lowercase ASCII Python identifier, e.g. 'my_project'"
    fix = "give another package_name (e.g. package_name=my_" + PACKAGE + ")"
    if keyword.iskeyword(PACKAGE) or keyword.issoftkeyword(PACKAGE):
        return f"package_name {PACKAGE!r} is a Python keyword (`from {PACKAGE} import …` cannot parse): {fix}"
    if PACKAGE in sys.stdlib_module_names or PACKAGE == "test":  # the list leaves out the stdlib's own tests
        return f"package_name {PACKAGE!r} is a module of Python's standard library, which it would shadow: {fix}"
    if PACKAGE in TAKEN:
        return f"package_name {PACKAGE!r} is a package this project imports, which it would shadow: {fix}"
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", SLUG):
        return f"project_slug {SLUG!r} must be lowercase letters, digits and '-', e.g. 'my-project'"
    return None


if __name__ == "__main__":
    if message := problem():
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)
