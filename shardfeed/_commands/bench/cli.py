"""`shardfeed bench`'s flags (`add_arguments`) and its run (`run`): workloads, engines, report.

No TensorFlow at import: `shardfeed launch` builds the whole CLI parser.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shardfeed._commands.bench.engines import default_rows
from shardfeed._commands.bench.machine import machine_info
from shardfeed._commands.bench.report import to_markdown, write_chart
from shardfeed._commands.bench.schedule import release_loops, run_workload
from shardfeed._commands.bench.search import SEARCH_MODELS, SEARCH_VARIANTS
from shardfeed._commands.bench.variants import (
    OPTIONAL_VARIANTS,
    VARIANT_ALIASES,
    VARIANT_NOTES,
    VARIANT_TYPES,
    VARIANTS,
    Variant,
)
from shardfeed._commands.bench.workloads import LEARNING_RATE, WORKLOADS
from shardfeed._common.errors import message


def _csv_choice(
    choices: Mapping[str, object], aliases: dict[str, str]
) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        out = []
        for item in (t.strip() for t in text.split(",") if t.strip()):
            name = aliases.get(item, item)
            if name not in choices:
                raise argparse.ArgumentTypeError(
                    f"unknown name {item!r}; choose from {', '.join(choices)}"
                )
            if name not in out:
                out.append(name)
        if not out:
            raise argparse.ArgumentTypeError("expected at least one name")
        return out

    return parse


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, received {text!r}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `bench` flags to a subcommand parser.

    Args:
        parser: The `bench` subparser.

    Returns:
        None; the parser is extended in place.

    Example:
        >>> p = argparse.ArgumentParser(); add_arguments(p)
        >>> p.parse_args(["--workloads", "W2", "--rows-scale", "0.05"]).workloads
        ['W2']
    """
    parser.add_argument(
        "--workloads",
        type=_csv_choice(WORKLOADS, {w.lower(): w for w in WORKLOADS}),
        help=f"comma-separated, from {','.join(WORKLOADS)} (default: all; none with "
        "--capacity)",
    )
    parser.add_argument(
        "--variants",
        type=_csv_choice(VARIANTS, VARIANT_ALIASES),
        help="comma-separated, from numpy,tfdata,tuned,jax,jax-tuned,shardfeed,floor,streaming,"
        "floor-opaque,shardfeed-jax,floor-jax,jax-nightly-tuned (or a-h: a-f numpy,tfdata,"
        "tuned,shardfeed,floor,streaming, g jax, h jax-tuned; default: all but "
        "jax-nightly-tuned). jax, jax-tuned, shardfeed-jax and floor-jax run Keras on JAX in a "
        "worker process each, skipped with the reason when JAX does not import; "
        "jax-nightly-tuned runs jax-tuned on keras-nightly in one, from the folder "
        "$SHARDFEED_KERAS_NIGHTLY_PATH names (skipped, saying why, without it). With "
        "KERAS_BACKEND=jax the whole bench runs on Keras' JAX backend, without TensorFlow: "
        "variants from jax,jax-tuned,shardfeed,floor (default: those four) and "
        "jax-nightly-tuned",
    )
    parser.add_argument(
        "--epochs",
        type=_positive(int),
        default=3,
        help="timed epochs per variant, after one warm-up epoch (default: 3)",
    )
    parser.add_argument(
        "--rows-scale",
        type=_positive(float),
        default=1.0,
        help="scale every workload's rows (at least two of its batches), e.g. 0.05 for a quick "
        "check",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="directory for bench.json, bench.md and bench.png (default: bench-results/)",
    )
    parser.add_argument("--seed", type=int, default=0, help="data and weights seed (default: 0)")
    parser.add_argument(
        "--probe-budget-s",
        type=_positive(float),
        default=120.0,
        help="stop a tuning probe that runs longer than this (default: 120)",
    )
    parser.add_argument(
        "--engines",
        action="store_true",
        help="also time the engines (single device, MirroredStrategy over 2 CPU devices, "
        "2 MultiWorkerMirroredStrategy workers, 2 Horovod ranks) on --engine-workloads",
    )
    parser.add_argument(
        "--engine-workloads",
        type=_csv_choice(WORKLOADS, {w.lower(): w for w in WORKLOADS}),
        default=["W2"],
        help="the workloads --engines trains, each at its batch per replica (default: W2; "
        "W5 for the embedding towers, whose gradients are IndexedSlices)",
    )
    parser.add_argument(
        "--engine-rows",
        type=_positive(int),
        help="rows for --engines and --shuffles (default: 200,000 for W2, else the "
        "workload's rows)",
    )
    parser.add_argument(
        "--shuffles",
        action="store_true",
        help="also time the three shuffles of several replicas (sharded global order with "
        "its per-epoch exchange, sharded local, replicated) on 2 and 4 CPU devices and "
        "2 workers, with --engine-rows rows",
    )
    parser.add_argument(
        "--capacity",
        action="store_true",
        help="Keras on JAX only: also find the largest float32 dataset (32 features) that "
        "trains resident on the first device (placement replicate), growing it in shares "
        "of the device's memory_stats()['bytes_limit'] until the dataset refuses it or "
        "the device runs out of memory; alone unless --workloads is given",
    )
    parser.add_argument(
        "--capacity-limit-bytes",
        type=_positive(int),
        help="stand in for the device's bytes_limit in --capacity (CPU devices report "
        "none), passed to the dataset as LoadOptions(device_memory_bytes=...)",
    )
    parser.add_argument(
        "--search",
        action="store_true",
        help="also time a KerasTuner RandomSearch over --search-model (--search-trials trials "
        "of --search-epochs epochs, the model's rows times --rows-scale), each variant in a fresh "
        "process, compile and upload included: trials per minute; alone unless --workloads "
        "is given",
    )
    parser.add_argument(
        "--search-variants",
        type=_csv_choice(SEARCH_VARIANTS, {}),
        default=list(SEARCH_VARIANTS),
        help=f"comma-separated, from {','.join(SEARCH_VARIANTS)} (default: all; the jax* ones "
        "run in --jax-python)",
    )
    parser.add_argument(
        "--search-model",
        choices=list(SEARCH_MODELS),
        default="mlp",
        help="what --search tunes: W2's MLP (default), keras-io's text-classification "
        "Transformer (1/20 of W2's rows at --rows-scale 1) or its time-series Conv1D network "
        "(1/50)",
    )
    parser.add_argument(
        "--search-trials", type=_positive(int), default=10, help="trials (default: 10)"
    )
    parser.add_argument(
        "--search-epochs", type=_positive(int), default=3, help="epochs per trial (default: 3)"
    )
    parser.add_argument(
        "--horovod-python",
        help="a Python with Horovod (e.g. the venv .ci/horovod_env.sh "
        "prints) for the Horovod row of --engines",
    )
    parser.add_argument(
        "--jax-python",
        default=os.environ.get("SHARDFEED_JAX_PYTHON") or sys.executable,
        help="a Python with Keras and JAX, where the jax variants run (e.g. .venv-jax/bin/python, "
        "which .ci/setup makes without TensorFlow: TensorFlow imports JAX when it is installed "
        "beside it; default: $SHARDFEED_JAX_PYTHON, else this Python)",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark and writes `bench.json`, `bench.md` and `bench.png`.

    Args:
        args: Parsed flags (see `add_arguments`).

    Returns:
        0 on success (the CLI's exit status).

    Example:
        >>> from shardfeed._commands.cli import main
        >>> main(["bench", "--workloads", "W2", "--rows-scale", "0.02", "--epochs", "1"])
        0
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    names, notes, types, baseline, on_jax = _variants_for_backend(args)
    workloads = args.workloads or ([] if args.capacity or args.search else list(WORKLOADS))
    args = argparse.Namespace(**{**vars(args), "variants": names, "workloads": workloads})
    report: dict[str, Any] = {
        "machine": machine_info(None if on_jax else args.jax_python),
        "conditions": {
            "batch_size": {name: WORKLOADS[name].batch_size for name in args.workloads},
            "optimizer": f"Adam(learning_rate={LEARNING_RATE})",
            "timed_epochs": args.epochs,
            "statistic": f"median of {args.epochs} timed epoch(s) per variant",
            "schedule": "one warm-up epoch per variant (compilation included), then "
            "round-robin one epoch per variant per round, order rotated each round",
            "rows_scale": args.rows_scale,
            "seed": args.seed,
            "variants": notes,
        },
        "workloads": {},
    }
    for name in args.workloads:
        report["workloads"][name] = run_workload(WORKLOADS[name], args, types, baseline)
        release_loops()
    extra_markdown = []
    if args.engines:
        from shardfeed._commands.bench import engines as _engines

        report["engines"] = []
        for name in args.engine_workloads:
            rows = args.engine_rows or default_rows(name)
            results = _engines.run_engines(rows, args.epochs, args.horovod_python, workload=name)
            report["engines"] += results
            extra_markdown.append(_engines.to_markdown(results, rows, args.epochs, name))
    if args.capacity:
        from shardfeed._commands.bench import capacity as _capacity

        report["capacity"] = _capacity.run_capacity(args.capacity_limit_bytes, args.seed)
        extra_markdown.append(_capacity.to_markdown(report["capacity"]))
    if args.search:
        from shardfeed._commands.bench import search as _search

        model = _search.SEARCH_MODELS[args.search_model]
        rows = max(2 * _search.BATCH_SIZE, round(model.rows * args.rows_scale))
        jax_python = sys.executable if on_jax else args.jax_python
        report["search"] = _search.run_search(
            args.search_variants, rows, args.search_trials, args.search_epochs, args.seed,
            jax_python, args.search_model,
        )
        extra_markdown.append(_search.to_markdown(report["search"]))
    shuffle_rows = args.engine_rows or default_rows("W2")  # the shuffles train W2's model
    if args.shuffles:
        from shardfeed._commands.bench import shuffles as _shuffles

        report["shuffles"] = _shuffles.run_shuffles(shuffle_rows, args.epochs)
    args.out.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(report)
    for table in extra_markdown:
        markdown += "\n" + table + "\n"
    if args.shuffles:
        markdown += (
            "\n" + _shuffles.to_markdown(report["shuffles"], shuffle_rows, args.epochs) + "\n"
        )
    (args.out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "bench.md").write_text(markdown)
    written = [args.out / "bench.json", args.out / "bench.md"]
    no_chart = ""
    if not report["workloads"]:
        no_chart = " (no bench.png: no workloads)"
    elif importlib.util.find_spec("matplotlib") is None:
        no_chart = " (no bench.png: Matplotlib is not installed here)"
    else:
        write_chart(report, args.out / "bench.png")
        written.append(args.out / "bench.png")
    print(markdown)
    print(f"Wrote {', '.join(map(str, written))}{no_chart}")
    return 0


def _variants_for_backend(
    args: argparse.Namespace,
) -> tuple[list[str], dict[str, str], Mapping[str, Callable[..., Variant]], str, bool]:
    """What this run times on Keras' backend: the variant names, their notes,
    the types that build them, the speed-up's baseline and whether on JAX.

    Raises:
        ValueError: On JAX, a TensorFlow-only variant, `--engines` or `--shuffles`; on
            TensorFlow, `--capacity`.
    """
    import keras

    if keras.backend.backend() != "jax":
        if args.capacity:
            raise ValueError(
                message(
                    "`--capacity` measures a JAX device's memory (memory_stats()).",
                    f"capacity=True, keras.backend.backend()={keras.backend.backend()!r}",
                    "Run it with KERAS_BACKEND=jax.",
                )
            )
        names = args.variants or [v for v in VARIANTS if v not in OPTIONAL_VARIANTS]
        return names, {v: VARIANT_NOTES[v] for v in names}, VARIANT_TYPES, "numpy", False
    from shardfeed._commands.bench import jax_variants as _jax

    names = args.variants or list(_jax.JAX_VARIANTS)
    _jax.check_variants(names)
    if args.engines or args.shuffles:
        raise ValueError(
            message(
                "`--engines` and `--shuffles` time TensorFlow's engines and shuffles.",
                f"engines={args.engines}, shuffles={args.shuffles}, "
                "keras.backend.backend()='jax'",
                "Run them with KERAS_BACKEND=tensorflow.",
            )
        )
    return names, _jax.variant_notes(names), _jax.JAX_VARIANT_TYPES, _jax.JAX_BASELINE, True
