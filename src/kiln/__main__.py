"""The ``kiln`` command (and ``python -m kiln``): every subcommand through one boundary, which imports no torch."""

from __future__ import annotations

from kiln.commands.boundary import main

if __name__ == "__main__":
    main()
