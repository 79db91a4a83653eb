"""`shardfeed` command line: one subcommand per job, each in its own module.

Owns the subcommand table (`SUBCOMMANDS`); each module defines
`add_arguments(parser)` and `run(args) -> int` and is imported only when its
subcommand runs, so `shardfeed launch` does not import TensorFlow.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "demo": (
        "shardfeed._commands.demo",
        "train the main job on built-in data, then compare with model.fit",
    ),
    "bench": (
        "shardfeed._commands.bench.cli",
        "benchmark shardfeed.fit against model.fit and the compute floor",
    ),
    "launch": (
        "shardfeed._launch.cli",
        "start N workers (TF_CONFIG, horovodrun or mpirun), here or across hosts (--hosts)",
    ),
    "credentials": (
        "shardfeed._commands.credentials",
        "make a multi-host job's mutual-TLS credentials (for `launch --mtls-dir`)",
    ),
    "plan": ("shardfeed._commands.plan", "print per-rank rows, bytes, steps and memory fit"),
    "split": (
        "shardfeed._commands.split",
        "write a dataset as per-rank shard files plus a manifest",
    ),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="shardfeed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    modules: dict[str, Any] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub_parser)
        modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
