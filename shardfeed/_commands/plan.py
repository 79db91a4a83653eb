"""`shardfeed plan`: the command line of `memory_plan`.

Parses inputs (`name=file...`, or `name=SHAPE:DTYPE`) and sizes (`16GiB`),
prints the plan's table and advice, and turns the verdict into an exit code
(0 fits, 1 does not, 2 bad input). Never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Literal

from shardfeed._commands import inputs as _inputs
from shardfeed._common import errors as _errors
from shardfeed._common import host as _host
from shardfeed._common.units import parse_size
from shardfeed._data.described import describe
from shardfeed._data.memplan import memory_plan

_SHAPE_SPEC_RE = re.compile(r"(\d+(?:x\d+)*):(\w+)")


def _open_spec(spec: str) -> tuple[str, Any]:
    """`name=SHAPE:DTYPE` -> a described array; `name=file...` -> a lazy file leaf."""
    name, sep, location = spec.partition("=")
    if not sep or not name or not location:
        raise ValueError(
            _errors.message(
                "Each input must be written `name=path` or `name=SHAPE:DTYPE`.",
                f"input={spec!r}",
                "Write e.g. `x=train_x.npy` or `x=1000000x32:float32 y=1000000:int64`.",
            )
        )
    # Files always have a suffix (.npy, .npz, .h5, .parquet); shapes never have a dot.
    if "." in location:
        return _inputs.open_input(spec)  # opens file headers only; reads no rows
    match = _SHAPE_SPEC_RE.fullmatch(location)
    if not match:
        raise ValueError(
            _errors.message(
                "A shape input must be `name=ROWSxD1x...:DTYPE` with whole numbers.",
                f"input={spec!r}",
                "Write e.g. `x=1000000x32:float32` or `y=1000000:int64`.",
            )
        )
    shape = tuple(int(d) for d in match[1].split("x"))
    return name, describe(name, (shape, match[2]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `shardfeed plan`'s arguments to `parser`."""
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="SPEC",
        help="arrays: name=file.npy, name=file.npz:key, name=file.h5:dataset, "
        "name=file.parquet:column, or name=SHAPE:DTYPE such as x=1000000x32:float32",
    )
    parser.add_argument(
        "--num-workers", metavar="N", type=int, required=True, help="workers (ranks)"
    )
    parser.add_argument(
        "--replicas-per-worker",
        metavar="R",
        type=int,
        default=1,
        help="devices per worker (default 1)",
    )
    parser.add_argument(
        "--workers-per-host",
        metavar="W",
        type=int,
        default=None,
        help="workers started on each host (default: what the launcher set, e.g. "
        "SHARDFEED_LOCAL_SIZE, else 1); with host RAM as the device memory, all their "
        "shards must fit in one host together",
    )
    parser.add_argument(
        "--per-replica-batch-size",
        metavar="B",
        type=int,
        required=True,
        help="rows per replica per step",
    )
    parser.add_argument(
        "--placement",
        choices=("shard", "replicate"),
        default="shard",
        help="shard: each device holds its slice of rows (default); replicate: every row",
    )
    parser.add_argument("--drop-remainder", action="store_true", help="drop a partial last step")
    parser.add_argument(
        "--shuffle",
        choices=("global", "local", "none"),
        default="global",
        help="global (default): sharded rows are exchanged each epoch, counting a staging "
        "buffer per device; local: each device shuffles its rows; none: rows in order "
        "(sharded rows are exchanged once, with the same staging)",
    )
    parser.add_argument(
        "--exchange-buffer",
        metavar="SIZE",
        default="auto",
        help="staging buffer per device of the global shuffle's exchange (default auto: "
        "an eighth of the largest shard, 16MiB to 256MiB)",
    )
    parser.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="free memory per device, e.g. 16GiB or 80GB (default: GPU 0 via NVML, else "
        "this host's available RAM)",
    )
    parser.add_argument(
        "--memory-fraction",
        metavar="F",
        type=float,
        default=0.8,
        help="share of free memory the data may take (default 0.8)",
    )


_SHUFFLES: dict[str, bool | Literal["local"]] = {"global": True, "local": "local", "none": False}


def run(args: argparse.Namespace) -> int:
    """Runs `shardfeed plan`: 0 when every rank fits, 1 when one does not, 2 on bad input."""
    try:
        arrays = _inputs.open_inputs(args.inputs, _open_spec)
        device_memory = (
            None
            if args.device_memory is None
            else parse_size(args.device_memory, "--device-memory")
        )
        plan = memory_plan(
            arrays,
            num_workers=args.num_workers,
            replicas_per_worker=args.replicas_per_worker,
            per_replica_batch_size=args.per_replica_batch_size,
            placement=args.placement,
            drop_remainder=args.drop_remainder,
            device_memory_bytes=device_memory,
            memory_fraction=args.memory_fraction,
            shuffle=_SHUFFLES[args.shuffle],
            exchange_buffer_bytes=(
                "auto"
                if args.exchange_buffer == "auto"
                else parse_size(args.exchange_buffer, "--exchange-buffer")
            ),
            workers_per_host=(
                args.workers_per_host
                if args.workers_per_host is not None
                else min(_host.local_size(os.environ) or 1, max(1, args.num_workers))
            ),
        )
    except (ValueError, TypeError, OSError, ImportError) as err:
        print(f"shardfeed plan: error: {err}", file=sys.stderr)
        return 2
    print(plan.table())
    advice = plan.advice()
    if advice:
        print("\nto make it fit:")
        print("\n".join(f"- {line}" for line in advice))
    return 0 if plan.fits else 1
