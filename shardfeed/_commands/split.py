"""`shardfeed split`: the command line of `files.split` (`_data/split.py` owns the layout)."""

from __future__ import annotations

import argparse
import json
import sys

from shardfeed._commands.inputs import open_inputs
from shardfeed._data.formats.manifest import FILE_FORMATS
from shardfeed._data.split import DEFAULT_CHUNK_BYTES, split


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `shardfeed split`'s arguments to `parser`."""
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="NAME=PATH",
        help="arrays to split: name=file.npy, name=file.npz:key, name=file.h5:dataset or "
        "name=file.parquet:column (all with the same number of rows)",
    )
    parser.add_argument(
        "--num-shards", type=int, required=True, help="shards per array (usually the workers)"
    )
    parser.add_argument("--out", required=True, help="directory to write the shards into")
    parser.add_argument("--format", choices=FILE_FORMATS, default="npy", help="shard file format")
    parser.add_argument(
        "--chunk-mib",
        type=int,
        default=DEFAULT_CHUNK_BYTES // 1024**2,
        help="MiB of one array read at a time (bounds host memory; default 64)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing split")


def run(args: argparse.Namespace) -> int:
    """Runs `shardfeed split`; returns the exit status (0 on success, 2 on bad input)."""
    try:
        arrays = open_inputs(args.inputs)
        path = split(
            arrays,
            args.out,
            args.num_shards,
            args.format,
            chunk_bytes=args.chunk_mib * 1024**2,
            overwrite=args.overwrite,
        )
    except (ValueError, TypeError, OSError) as err:
        print(f"shardfeed split: error: {err}", file=sys.stderr)
        return 2
    summary = json.loads(path.read_text())
    print(
        f"shardfeed split: wrote {summary['num_rows']} rows of {', '.join(arrays)} as "
        f"{args.num_shards} shard(s) of {args.format} files; manifest: {path}"
    )
    return 0
