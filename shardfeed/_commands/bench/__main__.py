"""`python -m shardfeed._commands.bench`: the `shardfeed bench` subcommand on its own."""

from __future__ import annotations

import argparse
import sys

from shardfeed._commands.bench.cli import add_arguments, run

if __name__ == "__main__":  # pragma: no cover
    _parser = argparse.ArgumentParser(prog="shardfeed bench")
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
