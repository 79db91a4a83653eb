"""`shardfeed credentials DIR`: make a multi-host job's mutual-TLS credentials.

What to do with them is printed: put DIR on every host, then pass
`--mtls-dir DIR` to `shardfeed launch` (or SHARDFEED_MTLS_DIR=DIR to srun or
mpirun). The files and the rule live in `shardfeed._distribute.credentials`.
"""

from __future__ import annotations

import argparse
import sys

from shardfeed._distribute import credentials as _credentials


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="where to write them (must not exist)")
    parser.add_argument(
        "--valid-days",
        type=int,
        default=_credentials.DEFAULT_VALID_DAYS,
        metavar="D",
        help=f"how long the certificates are valid (default: {_credentials.DEFAULT_VALID_DAYS})",
    )


def run(args: argparse.Namespace) -> int:
    try:
        made = _credentials.make_credentials(args.directory, args.valid_days)
    except (ValueError, OSError, RuntimeError) as err:
        print(f"shardfeed credentials: error: {err}", file=sys.stderr, flush=True)
        return 2
    print(
        f"shardfeed credentials: wrote {made.directory} (a new CA's certificate, one worker "
        "certificate and its key; the CA's key is deleted). Put this directory on every host "
        "of the job (a shared file system, or copy it keeping its modes), then run "
        f"`shardfeed launch ... --mtls-dir {made.directory}` on each host (srun, mpirun: "
        f"{_credentials.MTLS_DIR_VARIABLE}={made.directory}). Whoever reads it can join the job."
    )
    return 0
