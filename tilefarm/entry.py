"""The `tilefarm` command's entry point. It loads the command line (tilefarm.cli, and with it the compiler) inside a
guard, so that a Ctrl-C in the moment a command starts ends like one during its work: one line and exit 130, not an
import traceback."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from tilefarm.cli import main as run_command

        return run_command()  # a command's own Ctrl-C is said by tilefarm.cli, naming the command
    except KeyboardInterrupt:  # before a command began: loading, or reading the arguments
        print("interrupted: tilefarm stopped while starting", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
