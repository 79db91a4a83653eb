"""The bench report's Markdown tables and PNG chart (the JSON is the report dict itself)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from shardfeed._commands.bench.machine import machine_line
from shardfeed._commands.bench.tuning import PROBE_EPOCHS, config_text
from shardfeed._commands.bench.variants import VARIANTS

# The variants that run the tuning probe: each gets the probe's line.
TUNED = ("tuned", "jax-tuned", "jax-nightly-tuned")


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:{spec}}{suffix}"


def _settings_text(settings: dict[str, Any]) -> str:
    return f"spe={settings.get('steps_per_execution')}, jit={settings.get('jit_compile')}"


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables, ready to paste into the README.

    Args:
        report: What `cli.run` builds (also the JSON).

    Returns:
        Markdown text: conditions, then one table per workload.

    Example:
        >>> print(to_markdown(json.loads(Path("bench-results/bench.json").read_text())))
    """
    m, c = report["machine"], report["conditions"]
    lines = [
        f"## shardfeed bench ({m['date_utc'][:10]})",
        "",
        machine_line(m),
        f"{c['optimizer']}; {c['statistic']}; {c['schedule']}; rows scale {c['rows_scale']}.",
    ]
    if c["timed_epochs"] < 3 or c["rows_scale"] < 1:
        lines.append(
            "**Smoke check (fewer than 3 timed epochs or scaled-down rows): not a result.**"
        )
    if report["workloads"]:  # none with `--capacity` alone
        lines += ["", "Variants:"]
        lines += [f"- **{VARIANTS[name]}**: {note}" for name, note in c["variants"].items()]
    for name, w in report["workloads"].items():
        lines += [
            "",
            f"### {name}: {w['description']}",
            "",
            f"{w['rows']:,} rows, batch {w['batch_size']}, {w['steps_per_epoch']} steps/epoch. "
            f"Inputs: {w['inputs']}",
            "",
            "| variant | settings | s/epoch | ms/step | x floor | speed-up vs fit(numpy) "
            "| final loss | setup s | warm-up s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in w["variants"].values():
            if "skipped" in r:
                lines.append(f"| {r['label']} | skipped: {r['skipped']} ||||||||")
                continue
            lines.append(
                f"| {r['label']} | {_settings_text(r['settings'])} "
                f"| {_fmt(r['median_epoch_s'], '.3f')} | {_fmt(r['ms_per_step'], '.3f')} "
                f"| {_fmt(r['ratio_to_floor'], '.2f', 'x')} "
                f"| {_fmt(r['speedup_vs_numpy'], '.2f', 'x')} | {_fmt(r['final_loss'], '.4f')} "
                f"| {_fmt(r['setup_s'], '.2f')} | {_fmt(r['warmup_s'], '.2f')} |"
            )
        lines += _other_floors(w["variants"])
        floor = w["variants"].get("floor") or {}
        if floor.get("augment_ms_per_step") is not None:
            share = floor["augment_ms_per_step"] / floor["ms_per_step"]
            lines += [
                "",
                f"Augmentation alone (same calls, no train step): "
                f"{floor['augment_ms_per_step']:.3f} ms/step, {share:.0%} of the floor's step.",
            ]
        for tuned in (w["variants"].get(name) or {} for name in TUNED):
            if "probe" not in tuned:
                continue
            probe = tuned["probe"]
            configs = "; ".join(config_text(p) for p in probe["configs"])
            lines += [
                "",
                f"Tuning probe of {tuned['label']} ({PROBE_EPOCHS} epochs of "
                f"{probe['steps_per_epoch']} steps, fastest after the first, "
                f"{tuned['probe_s']:.1f} s): {configs}. {probe['note']}.",
            ]
    return "\n".join(lines) + "\n"


def _other_floors(variants: dict[str, Any]) -> list[str]:
    """Lines under a workload's table: which Keras each worker process ran, the
    variants on another backend against that backend's floor, and
    `shardfeed.fit` against the opaque floor."""
    workers = [
        f"{r['label']}: {r['worker']['keras']} on Python {r['worker']['python']}"
        + (f", JAX {r['worker']['jax']}" if "jax" in r["worker"] else "")
        for r in variants.values()
        if "worker" in r
    ]
    lines = ["", f"Worker processes' Keras: {'; '.join(workers)}."] if workers else []
    backend = [
        f"{r['label']} {r['ratio_to_backend_floor']:.2f}x"
        for r in variants.values()
        if r.get("ratio_to_backend_floor") is not None
    ]
    if backend:
        lines += ["", f"Against their own backend's floor (floor on JAX): {'; '.join(backend)}."]
    opaque, fit = variants.get("floor-opaque") or {}, variants.get("shardfeed") or {}
    if opaque.get("median_epoch_s") and fit.get("median_epoch_s"):
        lines += [
            "",
            f"{fit['label']} against the {opaque['label']}: "
            f"{fit['median_epoch_s'] / opaque['median_epoch_s']:.2f}x.",
        ]
    return lines


def write_chart(report: dict[str, Any], path: Path) -> None:
    """A grouped bar chart of ratio to the floor per workload and variant.

    Uses Matplotlib's Agg canvas directly (no `pyplot`, no global backend).

    Args:
        report: What `cli.run` builds.
        path: The PNG to write.

    Returns:
        None; writes `path`.

    Example:
        >>> write_chart(report, Path("bench-results/bench.png"))
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    workloads = list(report["workloads"])
    names = [n for n in VARIANTS if any(n in w["variants"] for w in report["workloads"].values())]
    fig = Figure(figsize=(max(6.0, 2.2 * len(workloads) + 2), 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ratios = [
            (report["workloads"][w]["variants"].get(name) or {}).get("ratio_to_floor")
            for w in workloads
        ]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(workloads))]
        bars = ax.bar(xs, [r or 0.0 for r in ratios], width, label=VARIANTS[name])
        ax.bar_label(bars, labels=[_fmt(r, ".2f", "x") for r in ratios], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("seconds/epoch, ratio to the floor (lower is better)")
    c, m = report["conditions"], report["machine"]
    ax.set_title(
        f"{m.get('accelerator') or m['cpu']} ({m['cpus_usable']} cores), Keras {m['keras']} "
        f"on {m.get('keras_backend', 'tensorflow')}, "
        f"median of {c['timed_epochs']} epoch(s), rows scale {c['rows_scale']}",
        fontsize=8,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
