"""Summaries of a study's runs: per-variant mean and spread, a terminal table, CSV, JSON and a PNG plot.

Spread is the sample standard deviation over seeds (``n - 1`` in the denominator); it is 0 for a metric
measured on one seed, and for metrics that do not depend on the seed (parameters, FLOPs).

A run whose training diverged (``status: diverged``, a NaN or inf loss) keeps its cost metrics; it has no
quality metrics, so the variant's quality means come from its other seeds (or are absent), and the table,
CSV, JSON and plot say which seeds diverged. The report is always written for every variant.

Each file is replaced atomically (:mod:`bertblocks.atomic`): a kill or a full disk while writing never leaves
a truncated ``results.*`` in place of an earlier good one.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_bytes, write_text

#: metric → (column title, unit shown in the plot); in table order
METRICS: dict[str, tuple[str, str]] = {
    "params": ("params", "parameters"),
    "flops_per_token": ("FLOPs/token", "forward FLOPs per token (analytic)"),
    "flops_per_token_counted": ("counted", "forward FLOPs per token (FlopCounterMode)"),
    "latency_ms": ("latency ms", "forward latency, median (ms)"),
    "peak_mem_mib": ("peak MiB", "peak forward tensor memory (MiB)"),
    "train_loss": ("train loss", "final training loss"),
    "eval_loss": ("eval loss", "eval loss"),
    "perplexity": ("ppl", "eval perplexity"),
    "accuracy": ("accuracy", "eval accuracy"),
    "train_seconds": ("train s", "training time (s)"),
}
#: what the plot shows, when present
PLOTTED = ("params", "flops_per_token", "latency_ms", "peak_mem_mib", "eval_loss", "accuracy")


@dataclass
class VariantSummary:
    """Mean and spread of each metric over a variant's runs."""

    variant: str
    overrides: dict[str, Any]
    seeds: list[int]
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: seeds whose training diverged (NaN or inf loss): left out of the quality means
    diverged: list[int] = field(default_factory=list)


def summarize(variants: list[tuple[str, dict[str, Any]]], records: list[dict[str, Any]]) -> list[VariantSummary]:
    """One summary per ``(name, overrides)`` in study order, from the run records of that variant."""
    out = []
    for name, overrides in variants:
        runs = sorted((r for r in records if r["variant"] == name), key=lambda r: r["seed"])
        summary = VariantSummary(name, overrides, [r["seed"] for r in runs])
        summary.diverged = [r["seed"] for r in runs if r.get("status") == "diverged"]
        for metric in METRICS:
            values = [float(r["metrics"][metric]) for r in runs if metric in r["metrics"]]
            values = [v for v in values if math.isfinite(v)]  # records of older versions may hold NaN
            if values:
                summary.mean[metric] = statistics.fmean(values)
                summary.std[metric] = statistics.stdev(values) if len(values) > 1 else 0.0
        summary.notes = sorted({r["metrics"]["flops_note"] for r in runs if r["metrics"].get("flops_note")})
        out.append(summary)
    return out


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) >= 1000:
        return f"{int(value):,}"
    if value == 0:
        return "0"
    digits = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"


def format_table(title: str, summaries: list[VariantSummary]) -> str:
    """A plain-text table: one row per variant, ``mean ± std`` where runs differ."""
    metrics = [m for m in METRICS if any(m in s.mean for s in summaries)]
    header = ["variant", "seeds", *(METRICS[m][0] for m in metrics)]
    rows = []
    for s in summaries:
        cells = [s.variant, str(len(s.seeds))]
        for m in metrics:
            if m not in s.mean:
                cells.append("-")
            elif s.std.get(m):
                cells.append(f"{_number(s.mean[m])} ± {_number(s.std[m])}")
            else:
                cells.append(_number(s.mean[m]))
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        title,
        "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=False))),
    ]
    lines.append("  ".join("-" * w for w in widths))
    for cells in rows:
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=False)))
        )
    notes = sorted({f"{s.variant}: FLOPs {note}" for s in summaries for note in s.notes})
    notes += [
        f"{s.variant}: training diverged (NaN/inf loss) for seed{'s' if len(s.diverged) > 1 else ''} "
        f"{', '.join(map(str, s.diverged))}; left out of its quality metrics"
        for s in summaries
        if s.diverged
    ]
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def write_csv(path: Path, summaries: list[VariantSummary]) -> None:
    """One row per variant: ``METRIC`` (mean) and ``METRIC_std`` columns."""
    metrics = [m for m in METRICS if any(m in s.mean for s in summaries)]
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["variant", "seeds", "diverged_seeds", *(c for m in metrics for c in (m, f"{m}_std"))])
    for s in summaries:
        values = [v for m in metrics for v in (s.mean.get(m, ""), s.std.get(m, ""))]
        writer.writerow([s.variant, " ".join(map(str, s.seeds)), " ".join(map(str, s.diverged)), *values])
    write_text(path, buffer.getvalue())


def write_json(path: Path, title: str, summaries: list[VariantSummary], records: list[dict[str, Any]]) -> None:
    """Summaries and every run's record."""
    data = {
        "study": title,
        "variants": [
            {
                "variant": s.variant,
                "overrides": s.overrides,
                "seeds": s.seeds,
                "mean": s.mean,
                "std": s.std,
                "notes": s.notes,
                "diverged_seeds": s.diverged,
                "runs": sorted((r for r in records if r["variant"] == s.variant), key=lambda r: r["seed"]),
            }
            for s in summaries
        ],
    }
    # strict JSON (NaN and inf written as null), so that every reader can load it
    write_text(path, json.dumps(_finite(data), indent=2, default=str, allow_nan=False) + "\n")


def _finite(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def write_plot(path: Path, title: str, summaries: list[VariantSummary]) -> None:
    """One panel per metric: bars for costs, points for quality (zoomed), error bars = std over seeds."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    metrics = [m for m in PLOTTED if any(m in s.mean for s in summaries)]
    cols = min(3, len(metrics)) or 1
    rows = math.ceil(len(metrics) / cols) or 1
    names = [s.variant for s in summaries]
    height = max(2.2, 0.35 * len(names) + 1.2)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, height * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        means = [s.mean.get(metric, math.nan) for s in summaries]
        stds = [s.std.get(metric, 0.0) for s in summaries]
        if metric in ("eval_loss", "accuracy"):
            # quality differences are small beside the value: points with error bars on a zoomed axis
            ax.errorbar(means, range(len(names)), xerr=stds, fmt="o", color="#C44E52", ecolor="#222222", capsize=3)
            ax.margins(x=0.25, y=0.15)
        else:
            ax.barh(range(len(names)), means, xerr=stds, color="#4C72B0", ecolor="#222222", capsize=3)
        labels = [f"{n} (diverged)" if s.diverged else n for n, s in zip(names, summaries, strict=True)]
        ax.set_yticks(range(len(names)), labels, fontsize=8)
        ax.tick_params(labelleft=ax.get_subplotspec().is_first_col())  # names once per row of panels
        ax.invert_yaxis()
        ax.set_title(METRICS[metric][1], fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    try:
        image = io.BytesIO()
        fig.savefig(image, dpi=110, format="png")
    finally:
        plt.close(fig)
    write_bytes(path, image.getvalue())
