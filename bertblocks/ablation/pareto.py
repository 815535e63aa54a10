"""Quality against cost: the Pareto front of a study's variants, and a plot that marks it.

A variant is on the *front* for a (cost, quality) pair when no other variant is at least as good on both
axes and strictly better on one: every variant off the front has another that is cheaper-or-equal and
better-or-equal. Directions:

* costs are lower-better (parameters, FLOPs per token, latency, peak memory), except a throughput
  (``train_tokens_per_s``), which is higher-better;
* a quality metric is lower-better when its name ends in ``loss`` or is ``perplexity``, higher-better
  otherwise (``accuracy``, and downstream scores such as an F1 or a correlation); ``--higher`` /
  ``--lower`` (or the ``lower_quality`` argument) say it for a metric whose name misleads.

The front is computed on the means over seeds. The plot draws each variant's 95% interval (quality) and
its std over seeds (a timed cost) as error bars, so a front point whose interval overlaps a dominated
neighbour's is marked but not resolved: the table's Δ column says which differences the study can tell
apart.

A downstream metric (:mod:`bertblocks.ablation.downstream`) is named ``TASK/METRIC``, as in the table
and ``results.json``'s ``downstream`` object (``number/accuracy``); its error bar is its 95% interval.

The runner writes ``results-pareto.png`` beside ``results.png`` for a study that trains: one panel per
cost it measured (used parameters, FLOPs per token, latency, peak memory, training tokens/s) against
its primary quality metric (eval loss, else accuracy, else train loss), and, for a study with
``downstream:`` tasks, a second row of panels per task against its first metric (``number/accuracy``).
To redraw it for other metrics from a finished study (and print each front)::

    python -m bertblocks.ablation.pareto OUT/results.json --quality accuracy --cost latency_ms
    python -m bertblocks.ablation.pareto OUT/results.json --quality eval_loss --quality number/accuracy --out p.png
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BertBlocksError
from ..readers import read_json
from .report import METRICS, VariantSummary, noisy_timings, save_figure, summary_dict

#: costs the plot puts on its x axes, in panel order (``params_used`` stands in for ``params`` when present)
COSTS = ("params_used", "flops_per_token", "latency_ms", "peak_mem_mib", "train_tokens_per_s")
#: costs where more is better
HIGHER_COSTS = frozenset({"train_tokens_per_s"})
#: costs where less is better
LOWER_COSTS = frozenset(
    {
        "params",
        "params_used",
        "flops_per_token",
        "flops_per_token_counted",
        "latency_ms",
        "peak_mem_mib",
        "train_seconds",
    }
)
#: the quality metric plotted when none is named: the first one the study has
PRIMARY_QUALITY = ("eval_loss", "accuracy", "train_loss")


class ParetoError(BertBlocksError, ValueError):
    """A Pareto plot or front that cannot be made (a metric the results do not hold, an unreadable file)."""


@dataclass(frozen=True)
class Point:
    """One variant on a (cost, quality) plane.

    Attributes:
        variant: the variant's name.
        cost, quality: the means over seeds.
        cost_err: the std over seeds of the cost (0 for a deterministic cost).
        quality_err: the half-width of the quality's 95% interval, else its std over seeds.
        on_front: whether no other variant dominates it.
    """

    variant: str
    cost: float
    quality: float
    cost_err: float
    quality_err: float
    on_front: bool


def lower_is_better(metric: str) -> bool:
    """Whether a smaller ``metric`` is better (see the module docstring for the rule)."""
    if metric in HIGHER_COSTS:
        return False
    return metric in LOWER_COSTS or metric.endswith("loss") or metric == "perplexity"


def pareto_front(
    costs: Sequence[float], qualities: Sequence[float], *, lower_cost: bool = True, lower_quality: bool = True
) -> list[bool]:
    """For each point, whether it is on the Pareto front: no other point is at least as good on both axes
    and strictly better on one. A point with a non-finite coordinate is never on the front and dominates
    nothing; equal points are all on it (none is strictly better).

    Raises:
        ParetoError: ``costs`` and ``qualities`` differ in length.
    """
    if len(costs) != len(qualities):
        raise ParetoError(f"{len(costs)} costs but {len(qualities)} quality values")
    # turn both axes into "smaller is better"
    points = [
        (c if lower_cost else -c, q if lower_quality else -q) if math.isfinite(c) and math.isfinite(q) else None
        for c, q in zip(costs, qualities, strict=True)
    ]
    front = []
    for i, p in enumerate(points):
        if p is None:
            front.append(False)
            continue
        dominated = any(
            q is not None and q[0] <= p[0] and q[1] <= p[1] and (q[0] < p[0] or q[1] < p[1])
            for j, q in enumerate(points)
            if j != i
        )
        front.append(not dominated)
    return front


def _as_dicts(variants: Sequence[VariantSummary | Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [summary_dict(v) if isinstance(v, VariantSummary) else v for v in variants]


def _value(variant: Mapping[str, Any], metric: str) -> tuple[float, float] | None:
    """The variant's mean of ``metric`` and its error bar: a summary metric, or a downstream ``TASK/METRIC``."""
    mean = (variant.get("mean") or {}).get(metric)
    if isinstance(mean, int | float):
        return float(mean), _error(variant, metric)
    entry = (variant.get("downstream") or {}).get(metric)
    if isinstance(entry, Mapping) and isinstance(entry.get("mean"), int | float):
        interval = entry.get("interval")
        half = interval.get("half_width") if isinstance(interval, Mapping) else None
        finite = isinstance(half, int | float) and math.isfinite(half)
        return float(entry["mean"]), float(half) if finite else 0.0
    return None


def _present(variants: Sequence[Mapping[str, Any]]) -> set[str]:
    """Every metric some variant holds: its summary metrics and its downstream ``TASK/METRIC`` keys."""
    return {m for v in variants for m in [*(v.get("mean") or {}), *(v.get("downstream") or {})]}


def downstream_qualities(variants: Sequence[VariantSummary | Mapping[str, Any]]) -> list[str]:
    """The first metric of each downstream task (``number/accuracy``), in the order the results hold them."""
    keys: dict[str, str] = {}
    for v in _as_dicts(variants):
        for key in v.get("downstream") or {}:
            keys.setdefault(key.partition("/")[0], key)
    return list(keys.values())


def _error(variant: Mapping[str, Any], metric: str) -> float:
    interval = (variant.get("intervals") or {}).get(metric)
    half = interval.get("half_width") if isinstance(interval, Mapping) else None
    if isinstance(half, int | float) and math.isfinite(half):  # an unknown interval is null in results.json
        return float(half)
    value = (variant.get("std") or {}).get(metric)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


def pareto_points(
    variants: Sequence[VariantSummary | Mapping[str, Any]],
    cost: str,
    quality: str,
    *,
    lower_quality: bool | None = None,
) -> list[Point]:
    """The variants that have both metrics, as points with their front membership.

    Args:
        variants: :class:`~bertblocks.ablation.report.VariantSummary` objects, or their
            :func:`~bertblocks.ablation.report.summary_dict` form (``results.json``'s ``variants``).
        cost, quality: metric names (keys of each variant's ``mean``, or a downstream ``TASK/METRIC``).
        lower_quality: whether a smaller quality is better; default: :func:`lower_is_better`.
    """
    lower_quality = lower_is_better(quality) if lower_quality is None else lower_quality
    chosen = []
    for v in _as_dicts(variants):
        c, q = _value(v, cost), _value(v, quality)
        if c is not None and q is not None:
            chosen.append((str(v["variant"]), c, q))
    front = pareto_front(
        [c[0] for _, c, _ in chosen],
        [q[0] for _, _, q in chosen],
        lower_cost=lower_is_better(cost),
        lower_quality=lower_quality,
    )
    return [Point(name, c[0], q[0], c[1], q[1], on) for (name, c, q), on in zip(chosen, front, strict=True)]


def primary_quality(variants: Sequence[VariantSummary | Mapping[str, Any]]) -> str | None:
    """The quality metric to plot: eval loss, else accuracy, else train loss (``None``: a costs-only study)."""
    present = {m for v in _as_dicts(variants) for m in (v.get("mean") or {})}
    return next((m for m in PRIMARY_QUALITY if m in present), None)


def _costs_present(variants: Sequence[Mapping[str, Any]]) -> list[str]:
    """The default costs: those the variants hold, less the timings whose spread over seeds is at least their
    differences (:func:`~bertblocks.ablation.report.noisy_timings`: measured under load, they rank nothing)."""
    present = {m for v in variants for m in (v.get("mean") or {})}
    noisy = set(noisy_timings([(v.get("mean") or {}, v.get("std") or {}) for v in variants]))
    costs = [c for c in COSTS if c in present and c not in noisy]
    if "params_used" not in present and "params" in present:
        costs.insert(0, "params")
    return costs


def _label(metric: str) -> str:
    return METRICS[metric][1] if metric in METRICS else metric


def write_pareto_plot(
    path: Path,
    title: str,
    variants: Sequence[VariantSummary | Mapping[str, Any]],
    *,
    quality: str | Sequence[str] | None = None,
    costs: Sequence[str] | None = None,
    lower_quality: bool | None = None,
    controls: Sequence[Any] = (),
) -> bool:
    """One panel per cost and quality: quality against that cost, the front's variants filled and joined by
    a step line, the others hollow. ``quality`` is one metric or several (one row of panels each); by
    default the primary quality and then each downstream task's first metric. A cost whose values are all
    equal is left out (its panel would rank nothing: every point at one x). ``controls``: the downstream
    control rows (:func:`bertblocks.ablation.downstream.controls`), drawn as dashed horizontal lines in
    their task's panels. Returns ``False`` (and writes nothing) when there is no quality metric or no cost
    to plot.

    Raises:
        ParetoError: a ``quality`` or cost named that no variant holds.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    dicts = _as_dicts(variants)
    present = _present(dicts)
    named = [quality] if isinstance(quality, str) else list(quality or [])
    for metric in [*named, *(costs or [])]:
        if metric not in present:
            raise ParetoError(f"no variant has {metric!r}; the results hold: {', '.join(sorted(present))}")
    if not named:
        primary = primary_quality(dicts)
        named = [primary, *downstream_qualities(dicts)] if primary is not None else []
    chosen = [c for c in (list(costs) if costs else _costs_present(dicts)) if not _all_equal(dicts, c)]
    if not named or not chosen:
        return False
    # one quality: up to three panels a row; several: one row of panels per quality, so each row reads alone
    cols = min(3, len(chosen)) if len(named) == 1 else len(chosen)
    per_quality = math.ceil(len(chosen) / cols)
    rows = per_quality * len(named)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.8 * rows), squeeze=False)
    flat = list(axes.flat)
    used: set[int] = set()
    for index, (metric, cost) in enumerate((m, c) for m in named for c in chosen):
        slot = (index // len(chosen)) * per_quality * cols + index % len(chosen)
        used.add(slot)
        _panel(flat[slot], dicts, cost, metric, lower_is_better(metric) if lower_quality is None else lower_quality)
        for row, style in zip(controls, ("dashed", "dotted", "dashdot"), strict=False):
            entry = row.entries.get(metric)
            if entry is not None and math.isfinite(entry.mean):
                flat[slot].axhline(entry.mean, color="#4C72B0", lw=0.8, ls=style, label=row.name, zorder=1)
        if controls and any(row.entries.get(metric) for row in controls):
            flat[slot].legend(fontsize=6, loc="best")
    for slot, ax in enumerate(flat):
        if slot not in used:
            ax.axis("off")
    fig.suptitle(f"{title}: Pareto front (filled) of quality against cost", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def _all_equal(dicts: Sequence[Mapping[str, Any]], cost: str) -> bool:
    """Whether every variant that has ``cost`` has the same value (one at least)."""
    values = {v["mean"][cost] for v in dicts if cost in (v.get("mean") or {})}
    return len(values) == 1 and sum(cost in (v.get("mean") or {}) for v in dicts) > 1


def _panel(ax: Any, dicts: Sequence[Mapping[str, Any]], cost: str, quality: str, lower_quality: bool) -> None:
    """One (cost, quality) panel: the points with their error bars, the front filled and joined."""
    points = pareto_points(dicts, cost, quality, lower_quality=lower_quality)
    for p in points:
        ax.errorbar(
            p.cost,
            p.quality,
            xerr=p.cost_err or None,
            yerr=p.quality_err or None,
            fmt="o",
            color="#C44E52" if p.on_front else "#8C8C8C",
            mfc="#C44E52" if p.on_front else "white",
            ecolor="#BBBBBB",
            capsize=2,
            zorder=3,
        )
        ax.annotate(p.variant, (p.cost, p.quality), fontsize=7, xytext=(4, 4), textcoords="offset points")
    front = sorted((p for p in points if p.on_front), key=lambda p: p.cost)
    if len(front) > 1:
        # the edge of the dominated region: it extends towards dearer costs
        where = "post" if lower_is_better(cost) else "pre"
        ax.step([p.cost for p in front], [p.quality for p in front], where=where, color="#C44E52", lw=1)
    better = "lower" if lower_is_better(cost) else "higher"
    ax.set_xlabel(f"{_label(cost)} ({better} is better)", fontsize=8)
    ax.set_ylabel(f"{_label(quality)} ({'lower' if lower_quality else 'higher'} is better)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.locator_params(axis="x", nbins=4)  # parameter counts in full take a panel's width at more ticks
    ax.margins(0.15)


def format_front(points: Sequence[Point], cost: str, quality: str) -> str:
    """The points as text, front first (by cost), then the dominated ones."""
    lines = [f"{quality} against {cost}:"]
    for p in sorted(points, key=lambda p: (not p.on_front, p.cost)):
        lines.append(
            f"  {'front' if p.on_front else '     '}  {p.variant}: {cost} {p.cost:.6g}, {quality} {p.quality:.6g}"
        )
    return "\n".join(lines)


def _controls(data: Mapping[str, Any]) -> list[Any]:
    """The downstream control rows of a results.json, rebuilt from its fine-tuning records."""
    from .downstream import controls

    runs = [r for v in data["variants"] for r in v.get("downstream_runs", [])]
    if not runs:
        return []
    tasks: dict[str, list[str]] = {}
    for key in dict.fromkeys(k for v in data["variants"] for k in v.get("downstream", {})):
        task, metric = key.rsplit("/", 1)
        tasks.setdefault(task, []).append(metric)
    baseline = next((v["baseline"] for v in data["variants"] if v.get("baseline")), None)
    return controls([*runs, *data.get("control_runs", [])], list(tasks.items()), baseline)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bertblocks.ablation.pareto RESULTS.json``: print the fronts and redraw the plot."""
    parser = argparse.ArgumentParser(prog="python -m bertblocks.ablation.pareto", description=__doc__.split("\n")[0])
    parser.add_argument("results", metavar="RESULTS.json", help="a study's results.json")
    parser.add_argument(
        "--quality",
        action="append",
        dest="qualities",
        help="quality metric, or a downstream TASK/METRIC; repeatable (default: eval_loss, else accuracy, else "
        "train_loss; the plot adds each downstream task's first metric)",
    )
    parser.add_argument("--cost", action="append", dest="costs", help="cost metric; repeatable (default: all)")
    direction = parser.add_mutually_exclusive_group()
    direction.add_argument("--higher", action="store_true", help="a higher quality is better")
    direction.add_argument("--lower", action="store_true", help="a lower quality is better")
    parser.add_argument("--out", metavar="PNG", help="where to draw the plot (default: no plot)")
    args = parser.parse_args(argv)
    try:
        data = read_json(Path(args.results))
        variants = data["variants"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"cannot read {args.results} as a study's results.json: {e}", file=sys.stderr)
        return 1
    lower = True if args.lower else False if args.higher else None
    qualities = args.qualities or [primary_quality(variants)]
    present = _present(variants)
    costs = args.costs or _costs_present(variants)
    missing = [m for m in [*qualities, *costs] if m is None or m not in present]
    if missing:
        print(f"no variant has {missing[0]!r}; the results hold: {', '.join(sorted(present))}", file=sys.stderr)
        return 1
    for quality in qualities:
        for cost in costs:
            print(format_front(pareto_points(variants, cost, quality, lower_quality=lower), cost, quality))
    if args.out:
        write_pareto_plot(
            Path(args.out),
            str(data.get("study", "")),
            variants,
            quality=args.qualities,  # none named: the default rows, downstream included
            costs=costs,
            lower_quality=lower,
            controls=_controls(data),
        )
        print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
