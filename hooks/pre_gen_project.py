"""Refuse typed names that cannot work, before anything is generated (names derived from any project name can)."""

from __future__ import annotations

import re
import sys

PACKAGE = "{{ cookiecutter.package_name }}"
SLUG = "{{ cookiecutter.project_slug }}"


def problem() -> str | None:
    if not (PACKAGE.isidentifier() and PACKAGE.islower() and PACKAGE.isascii()):
        return f"package_name {PACKAGE!r} must be a lowercase ASCII Python identifier, e.g. 'my_project'"
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", SLUG):
        return f"project_slug {SLUG!r} must be lowercase letters, digits and '-', e.g. 'my-project'"
    return None


if __name__ == "__main__":
    if message := problem():
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)
