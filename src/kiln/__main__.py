"""The ``kiln`` command (and ``python -m kiln``): every subcommand through kiln.boundary, which imports no torch."""

from __future__ import annotations

from kiln.boundary import main

if __name__ == "__main__":
    main()
