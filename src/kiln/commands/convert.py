"""``kiln convert -c <data YAML files> --output DIR``: any kiln datamodule to LitData chunks.

Takes the same ``-c`` files and ``--data.*`` flags as training (their other keys are ignored), so
what is streamed is exactly what would have been loaded.
"""

from __future__ import annotations

import sys
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser
from lightning.pytorch import LightningDataModule

from kiln.cli.config_errors import check_config_files
from kiln.data.streaming import META, SPLITS, convert
from kiln.errors import KilnError
from kiln.process import stop_signals


def main(args: list[str] | None = None) -> None:
    """``kiln convert -c <the data's YAML files> --output DIR``: convert, in one line or one error."""
    parser = ArgumentParser(prog="kiln convert", exit_on_error=False)
    parser.add_argument("-c", "--config", action=ActionConfigFile)
    parser.add_subclass_arguments(LightningDataModule, "data", required=True)
    parser.add_argument("--output", type=str, required=True, help="Folder of the chunks (and kiln.json).")
    parser.add_argument("--chunk_bytes", type=str, default="64MB")
    parser.add_argument("--num_workers", type=int, default=1, help="Processes writing chunks.")
    for ignored in ("run", "model", "trainer", "seed_everything", "non_finite"):  # training settings in -c files
        parser.add_argument(f"--{ignored}", type=Any, default=None)
    try:
        check_config_files(args or [])
        config = parser.parse_args(args)
        data = parser.instantiate(config).data
        stop_signals.stop_here("kiln convert stopped before writing chunks")
        written = convert(data, config.output, config.chunk_bytes, config.num_workers)
    except KilnError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except ArgumentError as err:  # a config that does not parse: its first line
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {written} ({', '.join(s for s in SPLITS if (written / s).is_dir())}; {META})")


if __name__ == "__main__":
    main()
