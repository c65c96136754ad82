"""The ``kiln`` command (and ``python -m kiln``): ``infer`` is sent on before anything imports torch."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["infer"]:
        from kiln.errors import KilnError
        from kiln.infer import infer_command

        try:
            infer_command(sys.argv[2:])
        except KilnError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(err.exit_code)
        return
    from kiln.cli import main as run

    run()


if __name__ == "__main__":
    main()
