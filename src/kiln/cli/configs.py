"""Where the default config lives: ``configs/train.yaml``, in the package or the checkout (no Lightning import)."""

from __future__ import annotations

from pathlib import Path

from kiln.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # kiln/


def config_dir(package: Path = PACKAGE_DIR) -> Path:
    """``configs/``: inside the package when installed from a wheel (``kiln/configs``), else the
    checkout's (an editable install or a generated project). Missing: one line, never no defaults."""
    for candidate in (package / "configs", package.parents[1] / "configs"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise ConfigError(
        f"no default config: neither {package / 'configs' / 'train.yaml'} nor "
        f"{package.parents[1] / 'configs' / 'train.yaml'} exists; reinstall the package, or run from the project"
    )
