"""The LightningCLI engine: config, links from the data, checkpoints rebuilt, run folders given (``build_cli``)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.cli.configs import config_dir
    from kiln.cli.engine import KilnCLI, build_cli
    from kiln.cli.plan import argv_hidden

__all__ = ["KilnCLI", "argv_hidden", "build_cli", "config_dir"]


def __getattr__(name: str) -> Any:
    """``build_cli`` and its kin on first use: the CLI's helpers (config errors, links) import no Lightning."""
    if name == "config_dir":  # no Lightning
        from kiln.cli.configs import config_dir

        return config_dir
    if name == "argv_hidden":
        from kiln.cli.plan import argv_hidden

        return argv_hidden
    if name in __all__:
        from kiln.cli import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
