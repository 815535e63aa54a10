"""Summaries of a study's runs: per-variant means with confidence intervals, paired differences against a
baseline variant, a terminal table, CSV, JSON and a PNG plot.

Quality metrics (train loss, eval loss, accuracy) get a 95% interval from
:func:`bertblocks.ablation.stats.interval`: it combines the spread over seeds with the noise of the eval set
itself, read from the per-token (per-example) eval values every run keeps, so a figure resting on a few
hundred eval tokens shows that it does. Each variant is also compared with the study's baseline (the
``baseline:`` variant, else the first): the paired difference over the same seeds and the same eval tokens,
marked ``≈`` when its interval contains 0 (not distinguishable). The perplexity is ``exp`` of the eval
loss; its interval is ``exp`` of the loss's. Costs keep the sample standard deviation over seeds
(``n - 1`` in the denominator): 0 for parameters and FLOPs, the timing noise for latency and train time.

A run whose training diverged (``status: diverged``, a NaN or inf loss) keeps its cost metrics; it has no
quality metrics, so the variant's quality means come from its other seeds (or are absent), and the table,
CSV, JSON and plot say which seeds diverged. The report is always written for every variant.

Each file is replaced atomically (:mod:`bertblocks.atomic`): a kill or a full disk while writing never leaves
a truncated ``results.*`` in place of an earlier good one.
"""

from __future__ import annotations

import io
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_bytes, write_text
from ..atomic import write_csv as write_csv_rows
from .stats import ADJUSTMENT_NAMES, LEVEL, SHORT_NAMES, Interval, interval, paired_difference

#: metric → (column title, unit shown in the plot); in table order
METRICS: dict[str, tuple[str, str]] = {
    "params": ("params", "parameters"),
    "params_used": ("used", "parameters reached at the run's sequence length"),
    "flops_per_token": ("FLOPs/token", "forward FLOPs per token (analytic)"),
    "flops_per_token_counted": ("counted", "forward FLOPs per token (FlopCounterMode)"),
    "latency_ms": ("latency ms", "forward latency, median (ms)"),
    "peak_mem_mib": ("peak MiB", "peak forward tensor memory (MiB)"),
    "train_loss": ("train loss", "final training loss"),
    "eval_loss": ("eval loss", "eval loss"),
    "perplexity": ("ppl", "eval perplexity"),
    "accuracy": ("accuracy", "eval accuracy"),
    "train_steps": ("steps", "optimizer steps taken (token, FLOP or time budgets)"),
    "train_flops": ("train FLOPs", "training FLOPs (3 × analytic forward, × real tokens)"),
    "train_seconds": ("train s", "training time (s)"),
    "train_tokens_per_s": ("train tok/s", "training throughput (real tokens/s)"),
}
#: what the plot shows, when present
PLOTTED = ("params", "flops_per_token", "latency_ms", "peak_mem_mib", "eval_loss", "accuracy")
#: metrics with a confidence interval (the rest: mean ± sample std over seeds)
QUALITY = ("train_loss", "eval_loss", "accuracy")
#: costs measured by a clock: load on the machine moves them (the rest are counted, and exact)
TIMINGS = ("latency_ms", "train_seconds", "train_tokens_per_s")
#: metric → the per-sample values (in a run's ``eval_samples``) it is the mean of
PER_SAMPLE = {"eval_loss": "loss", "accuracy": "correct"}


@dataclass
class VariantSummary:
    """Means, spreads, intervals and paired differences of a variant's runs.

    Attributes:
        mean, std: each metric's mean and sample standard deviation over the seeds.
        intervals: quality metric → its confidence interval (seeds and eval samples, see
            :mod:`bertblocks.ablation.stats`).
        baseline: the variant the differences are against (``None`` for the baseline itself).
        differences: quality metric → the paired difference ``this − baseline`` with its interval.
        eval_samples: eval tokens (mlm) or examples (classification) per seed the eval figures rest on;
            0 when the records hold none (an older version's).
        eval_unit: ``token`` or ``example``.
        eval_rows, eval_rows_asked: held-out rows evaluated, and how many ``train.eval_batches`` asked for.
    """

    variant: str
    overrides: dict[str, Any]
    seeds: list[int]
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: seeds whose training diverged (NaN or inf loss): left out of the quality means
    diverged: list[int] = field(default_factory=list)
    intervals: dict[str, Interval] = field(default_factory=dict)
    baseline: str | None = None
    differences: dict[str, Interval] = field(default_factory=dict)
    eval_samples: int = 0
    #: sentences the eval tokens come from, when the intervals resample sentences (0: tokens independent)
    eval_clusters: int = 0
    eval_unit: str = "token"
    eval_rows: int | None = None
    eval_rows_asked: int | None = None
    #: the sequence length ``params_used`` was counted at
    params_used_at: int | None = None
    #: ``task/metric`` → its :class:`~bertblocks.ablation.downstream.DownstreamSummary` (``downstream:`` tasks)
    downstream: dict[str, Any] = field(default_factory=dict)
    #: the largest one-minute load average seen while its runs measured, and the CPUs they had
    load_average: float | None = None
    cpus: int | None = None
    #: with ``train.lr_grid``: the learning rate each seed chose (in seed order)
    lrs: list[float] = field(default_factory=list)
    #: the training budget its runs had: ``kind`` (steps, tokens, flops, seconds), ``value``, and the seeds that
    #: stopped at the step cap before reaching it (``short``); empty for records of an older version
    budget: dict[str, Any] = field(default_factory=dict)
    #: with ``comparisons: all-pairs``: metric → an earlier variant (not the baseline) → ``this − that``
    pairs: dict[str, dict[str, Interval]] = field(default_factory=dict)


def run_samples(run: dict[str, Any], metric: str) -> list[float] | None:
    """The per-sample values ``metric`` of ``run`` is the mean of, when its record keeps them."""
    kept = run.get("eval_samples")
    key = PER_SAMPLE.get(metric)
    if not isinstance(kept, dict) or key is None or not isinstance(kept.get(key), list):
        return None
    return [float(v) for v in kept[key]]


def run_clusters(runs: list[dict[str, Any]], metric: str) -> list[int] | None:
    """The sentence of each eval token, when ``metric`` is the eval loss and every run keeps the same list
    (they evaluate the same tokens); ``None`` otherwise (then the tokens count as independent samples)."""
    if metric != "eval_loss" or not runs:
        return None
    kept = [
        r.get("eval_samples", {}).get("sentence") if isinstance(r.get("eval_samples"), dict) else None for r in runs
    ]
    first = kept[0]
    if not isinstance(first, list) or any(k != first for k in kept):
        return None
    return [int(c) for c in first]


def seed_metrics(runs: list[dict[str, Any]], metric: str) -> dict[int, float]:
    values = {r["seed"]: float(r["metrics"][metric]) for r in runs if metric in r["metrics"]}
    return {seed: v for seed, v in values.items() if math.isfinite(v)}  # records of older versions may hold NaN


def summarize(
    variants: list[tuple[str, dict[str, Any]]],
    records: list[dict[str, Any]],
    *,
    baseline: str | None = None,
    level: float = LEVEL,
) -> list[VariantSummary]:
    """One summary per ``(name, overrides)`` in study order, from the run records of that variant.

    Args:
        variants: ``(name, overrides)`` of each variant, in study order.
        records: the run records.
        baseline: the variant the others are compared with (default: the first).
        level: the confidence level of the intervals.
    """
    names = [name for name, _ in variants]
    baseline = baseline if baseline in names else (names[0] if names else None)
    by_variant = {name: sorted((r for r in records if r["variant"] == name), key=lambda r: r["seed"]) for name in names}
    out = []
    for name, overrides in variants:
        runs = by_variant[name]
        summary = VariantSummary(name, overrides, [r["seed"] for r in runs])
        summary.diverged = [r["seed"] for r in runs if r.get("status") == "diverged"]
        for metric in METRICS:
            values = list(seed_metrics(runs, metric).values())
            if values:
                summary.mean[metric] = statistics.fmean(values)
                summary.std[metric] = statistics.stdev(values) if len(values) > 1 else 0.0
        for metric in QUALITY:
            per_seed = seed_metrics(runs, metric)
            if not per_seed:
                continue
            rows = [run_samples(r, metric) for r in runs if r["seed"] in per_seed]
            matrix = None if any(row is None for row in rows) else rows
            clusters = run_clusters([r for r in runs if r["seed"] in per_seed], metric)
            summary.intervals[metric] = interval(
                matrix,  # type: ignore[arg-type]
                list(per_seed.values()),
                level,
                clusters=clusters,
            )
            if clusters is not None:
                summary.eval_clusters = len(set(clusters))
        summary.params_used_at = next(
            (r["metrics"]["params_used_at"] for r in runs if "params_used_at" in r["metrics"]), None
        )
        evaluated = [r for r in runs if "eval_loss" in r["metrics"]]
        if evaluated:
            loss = run_samples(evaluated[0], "eval_loss")
            summary.eval_samples = len(loss) if loss is not None else 0
            summary.eval_unit = str(evaluated[0].get("eval_samples", {}).get("unit", "token"))
            summary.eval_rows = evaluated[0]["metrics"].get("eval_rows")
            summary.eval_rows_asked = evaluated[0]["metrics"].get("eval_rows_asked")
        if name != baseline and baseline is not None:
            summary.baseline = baseline
            base_runs = by_variant[baseline]
            for metric in QUALITY:
                diff = paired_difference(
                    {r["seed"]: run_samples(r, metric) for r in runs},
                    {r["seed"]: run_samples(r, metric) for r in base_runs},
                    seed_metrics(runs, metric),
                    seed_metrics(base_runs, metric),
                    level,
                    clusters=run_clusters([*runs, *base_runs], metric),
                )
                if diff is not None:
                    summary.differences[metric] = diff
        summary.notes = sorted({r["metrics"]["flops_note"] for r in runs if r["metrics"].get("flops_note")})
        loads = [float(v) for r in runs for v in (r.get("load_average") or []) if isinstance(v, int | float)]
        summary.load_average = max(loads) if loads else None
        summary.cpus = next((int(r["cpus"]) for r in runs if isinstance(r.get("cpus"), int)), None)
        summary.lrs = [float(r["metrics"]["lr"]) for r in runs if isinstance(r["metrics"].get("lr"), int | float)]
        budgeted = [r for r in runs if isinstance(r["metrics"].get("budget"), str)]
        if budgeted:
            summary.budget = {
                "kind": budgeted[0]["metrics"]["budget"],
                "value": budgeted[0]["metrics"].get("budget_value"),
                "short": [r["seed"] for r in budgeted if r["metrics"].get("budget_reached") is False],
            }
        out.append(summary)
    return out


def small_eval_note(used: int, asked: int, seq_len: int) -> str:
    """What to say when ``train.eval_batches`` asks for more held-out rows than the eval set has."""
    return (
        f"train.eval_batches asks for {asked} held-out rows (eval_batches × batch_size), but the eval set has "
        f"only {used} (of {seq_len} tokens); all {used} were used. Leave eval_batches out to use the whole set, "
        f"or raise corpus.sentences or corpus.eval_fraction for more"
    )


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) >= 10:  # a count (steps, parameters): no decimals
        return f"{int(value):,}"
    if value == 0:
        return "0"
    digits = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"


def _pm(centre: float, half: float) -> str:
    """``centre ± half`` with ``half`` to two significant digits and ``centre`` to the same place, so a figure
    shows no more digits than its interval supports."""
    if not (math.isfinite(half) and half > 0):
        return _number(centre)
    places = max(0, 1 - math.floor(math.log10(half)))
    return f"{centre:.{places}f} ± {half:.{places}f}"


def _signed(iv: Interval) -> str:
    text = _pm(iv.estimate, iv.half_width) if iv.known else _number(iv.estimate)
    text = text if text.startswith("-") else f"+{text}"
    return f"{text} ≈" if not iv.distinguishable else text


def primary(summaries: list[VariantSummary]) -> str | None:
    """The quality metric the Δ column compares: eval loss, else accuracy, else train loss."""
    for metric in ("eval_loss", "accuracy", "train_loss"):
        if any(metric in s.differences for s in summaries):
            return metric
    return None


def format_table(title: str, summaries: list[VariantSummary]) -> str:
    """A plain-text table: one row per variant; quality metrics as ``mean ± half-width of the 95%
    interval``, costs as ``mean ± std over seeds`` where runs differ; the paired difference against the
    baseline, and how many eval samples the eval figures rest on."""
    metrics = [m for m in METRICS if any(m in s.mean for s in summaries)]
    compared = primary(summaries)
    baseline = next((s.baseline for s in summaries if s.baseline), None)
    with_eval = any("eval_loss" in s.mean for s in summaries)
    unit = next((s.eval_unit for s in summaries if s.eval_samples), "token")
    tuned = any(s.lrs for s in summaries)
    noisy = noisy_timings([(s.mean, s.std) for s in summaries])
    header = [
        "variant",
        "seeds",
        *(["lr"] if tuned else []),
        *(f"{METRICS[m][0]} ~" if m in noisy else METRICS[m][0] for m in metrics),
    ]
    if compared is not None:
        header.append(f"Δ {METRICS[compared][0]} vs {baseline}{_adjusted_tag(summaries)}")
    if with_eval:
        header.append(f"eval {unit}s")
    rows = []
    for s in summaries:
        cells = [s.variant, str(len(s.seeds)), *(["/".join(f"{lr:g}" for lr in s.lrs) or "-"] if tuned else [])]
        for m in metrics:
            if m not in s.mean:
                cells.append("-")
            elif m in s.intervals and s.intervals[m].known:
                iv = s.intervals[m]
                cells.append(_pm(iv.estimate, iv.half_width))
            elif m == "perplexity" and "eval_loss" in s.intervals and s.intervals["eval_loss"].known:
                iv = s.intervals["eval_loss"]  # exp of the loss's interval: not symmetric
                cells.append(
                    f"{_number(math.exp(iv.estimate))} [{_number(math.exp(iv.low))}, {_number(math.exp(iv.high))}]"
                )
            elif s.std.get(m):
                cells.append(f"{_number(s.mean[m])} ± {_number(s.std[m])}")
            else:
                cells.append(_number(s.mean[m]))
        if compared is not None:
            cells.append(
                _signed(s.differences[compared])
                if compared in s.differences
                else "(baseline)"
                if s.baseline is None
                else "-"
            )
        if with_eval:
            cells.append(f"{s.eval_samples:,}" if s.eval_samples else "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    decided = decisions_line(summaries)
    lines = [
        title,
        *([decided] if decided else []),
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
    notes += budget_notes(summaries)
    loaded = load_note(summaries)
    if loaded:
        notes.append(loaded)
    if tuned:
        notes.append(
            "lr: the learning rate each seed chose (in seed order) from train.lr_grid, by the loss on a validation "
            "split of the training rows, never on the eval set; the choice is part of each seed's run"
        )
    lengths = sorted({s.params_used_at for s in summaries if s.params_used_at})
    if lengths:
        notes.append(
            f"used: the parameters a pass over {'/'.join(map(str, lengths))} tokens reaches (position-table rows "
            "beyond that length, and an unused token-type row, left out)"
        )
    if any(s.intervals for s in summaries):
        level = next(iv.level for s in summaries for iv in s.intervals.values())
        notes.append(
            f"quality ± is the half-width of a {level:.0%} interval over seeds and eval {unit}s "
            f"(train loss: over seeds only); costs ± is the std over seeds"
        )
    if compared is not None:
        notes.append(
            f"Δ is paired with {baseline} (same seeds, same eval {unit}s); ≈: not distinguishable from 0"
            + (" after the adjustment above" if decided else " (its interval contains 0)")
        )
    sentences = sorted({s.eval_clusters for s in summaries if s.eval_clusters})
    if sentences:
        notes.append(
            f"eval loss intervals and Δ resample the {'/'.join(f'{n:,}' for n in sentences)} sentences the eval "
            "tokens come from, not single tokens (the tokens of a sentence share its difficulty)"
        )
    elif unit == "token" and any(s.eval_samples for s in summaries if "eval_loss" in s.intervals):
        notes.append(
            "eval tokens counted as independent (records without sentence ids, an older version): tokens of one "
            "sentence share its difficulty, so these intervals are too narrow"
        )
    if any(len(s.seeds) - len(s.diverged) == 1 for s in summaries if "eval_loss" in s.mean):
        notes.append("one seed: the intervals hold the eval-set noise only; the seed-to-seed spread is unknown")
    if any(s.intervals and not s.eval_samples for s in summaries if "eval_loss" in s.mean):
        notes.append("records without per-sample eval values (an older version): intervals over seeds only")
    short = next(
        (s for s in summaries if s.eval_rows_asked and s.eval_rows is not None and s.eval_rows_asked > s.eval_rows),
        None,
    )
    if short is not None:
        notes.append(
            f"train.eval_batches asks for {short.eval_rows_asked} held-out rows but the eval set has only "
            f"{short.eval_rows}; all {short.eval_rows} were used"
        )
    lines += [f"note: {n}" for n in notes]
    pairs = format_pairs(summaries)
    if pairs:
        lines += ["", pairs]
    return "\n".join(lines)


def noisy_timings(variants: Sequence[tuple[Mapping[str, float], Mapping[str, float]]]) -> list[str]:
    """The timing costs (:data:`TIMINGS`) that rank nothing: their spread over seeds (the largest std of a
    variant) is at least the largest difference between the variants' means. Load on the machine makes such
    figures; a table marks them and the Pareto front leaves them out.

    Args:
        variants: each variant's ``(mean, std)`` by metric.
    """
    noisy = []
    for metric in TIMINGS:
        means = [mean[metric] for mean, _ in variants if metric in mean]
        spreads = [std.get(metric, 0.0) for mean, std in variants if metric in mean]
        if len(means) > 1 and max(spreads) >= max(means) - min(means):
            noisy.append(metric)
    return noisy


def load_note(summaries: list[VariantSummary]) -> str | None:
    """What the table says of timings taken under load, or whose spread exceeds their differences."""
    noisy = noisy_timings([(s.mean, s.std) for s in summaries])
    loads = [s.load_average for s in summaries if s.load_average is not None]
    cpus = next((s.cpus for s in summaries if s.cpus), None)
    loaded = bool(loads and cpus and max(loads) > cpus)
    if not noisy and not loaded:
        return None
    text = ""
    if loaded:
        text = f"timings measured at a load average up to {max(loads):.1f} on {cpus} CPUs (more work than CPUs)"
    if noisy:
        names = ", ".join(METRICS[m][0] for m in noisy)
        text += ("; " if text else "") + (
            f"{names} (marked ~): the spread over seeds is at least the differences between variants, so they "
            "rank nothing and the Pareto front leaves them out"
        )
    return text


def budget_notes(summaries: list[VariantSummary]) -> list[str]:
    """Which training budget ruled: what every variant got the same amount of, and what it did not."""
    kinds = {s.budget["kind"] for s in summaries if s.budget}
    if not kinds:
        return []
    kind = kinds.pop()
    if kind == "steps":
        return ["budget: steps (every run took the same optimizer steps; variants differ in the FLOPs they spent)"]
    value = next(s.budget["value"] for s in summaries if s.budget)
    unit = {"tokens": "real training tokens", "flops": "training FLOPs", "seconds": "seconds of training"}[kind]
    notes = [
        f"budget: {kind} (every run trained until it had spent {value:.4g} {unit}, stopping within one step of it; "
        "the steps column says how many steps each variant took)"
    ]
    notes += [
        f"{s.variant}: seed(s) {', '.join(map(str, s.budget['short']))} stopped at the step cap before the budget"
        for s in summaries
        if s.budget.get("short")
    ]
    return notes


def decisions_line(summaries: list[VariantSummary]) -> str | None:
    """The sentence a table's header gives its decisions: the adjustment, over how many Δ, at what level."""
    adjusted = [
        iv
        for s in summaries
        for iv in [
            *s.differences.values(),
            *(e.difference for e in s.downstream.values() if e.difference is not None),
            *(d for pairs in s.pairs.values() for d in pairs.values()),
        ]
        if iv.adjustment is not None
    ]
    if not adjusted:
        return None
    first = adjusted[0]
    level = first.level
    name = ADJUSTMENT_NAMES.get(first.adjustment or "", first.adjustment)
    what = "false discovery rate" if first.adjustment == "bh" else "family-wise error"
    if first.adjustment == "none":
        return f"decisions: each Δ alone at {level:.0%} (no adjustment over the {first.family} Δ of this report)"
    return (
        f"decisions: {name} over all {first.family} Δ of this report ({what} ≤ {1 - level:.0%}); "
        f"≈ marks a Δ not resolved after adjustment, ± is each Δ's own {level:.0%} interval"
    )


def _adjusted_tag(summaries: list[VariantSummary]) -> str:
    """`` (Holm)`` in a Δ column's header: the adjustment its ``≈`` marks follow."""
    method = next(
        (iv.adjustment for s in summaries for iv in s.differences.values() if iv.adjustment is not None), None
    )
    return f" ({SHORT_NAMES[method]})" if method is not None else ""


def format_pairs(summaries: list[VariantSummary]) -> str:
    """With ``comparisons: all-pairs``: one row per pair of non-baseline variants (``later − earlier``), one
    column per compared metric, ``≈`` after the family's adjustment; empty otherwise."""
    keys: list[str] = []
    for s in summaries:
        keys += [k for k in s.pairs if k not in keys]
    if not keys:
        return ""
    rows = []
    names = [s.variant for s in summaries]
    for s in summaries:
        for other in names[: names.index(s.variant)]:
            if not any(other in s.pairs.get(k, {}) for k in keys):
                continue
            cells = [f"{s.variant} − {other}"]
            for key in keys:
                iv = s.pairs.get(key, {}).get(other)
                cells.append(_signed(iv) if iv is not None else "-")
            rows.append(cells)
    header = ["pair", *(f"Δ {METRICS[k][0]}" if k in METRICS else f"Δ {k}" for k in keys)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    out = ["pairs of variants besides the baseline (comparisons: all-pairs)", line(header)]
    out.append("  ".join("-" * w for w in widths))
    out += [line(r) for r in rows]
    out.append("note: these Δ are part of the family the decisions above are adjusted over")
    return "\n".join(out)


def write_csv(
    path: Path, summaries: list[VariantSummary], extra: tuple[list[str], list[list[Any]]] | None = None
) -> None:
    """One row per variant: ``METRIC`` (mean) and ``METRIC_std`` columns; for quality metrics also the
    interval (``METRIC_ci_low``, ``METRIC_ci_high``) and the paired difference with the baseline
    (``delta_METRIC``, ``delta_METRIC_ci_low``, ``delta_METRIC_ci_high``, the raw and adjusted p-values
    ``delta_METRIC_p``, ``delta_METRIC_p_adjusted`` and ``delta_METRIC_adjustment``, and
    ``delta_METRIC_distinguishable``, the adjusted decision).
    ``extra``: more columns at the end, a header and one row per summary (the downstream metrics)."""
    metrics = [m for m in METRICS if any(m in s.mean for s in summaries)]
    quality = [m for m in QUALITY if any(m in s.intervals for s in summaries)]
    interval_columns = [f"{m}_{end}" for m in quality for end in ("ci_low", "ci_high")]
    delta_columns = [
        f"delta_{m}{end}"
        for m in quality
        for end in ("", "_ci_low", "_ci_high", "_p", "_p_adjusted", "_adjustment", "_distinguishable")
    ]
    rows: list[list[Any]] = []  # written by atomic.write_csv: names such as `=2+3` are text, never formulas
    rows.append(
        [
            "variant",
            "seeds",
            "diverged_seeds",
            *(c for m in metrics for c in (m, f"{m}_std")),
            *interval_columns,
            "baseline",
            *delta_columns,
            "eval_samples",
            "lr_chosen",
            *(extra[0] if extra else []),
        ]
    )
    for index, s in enumerate(summaries):
        values = [v for m in metrics for v in (s.mean.get(m, ""), s.std.get(m, ""))]
        ends: list[Any] = []
        for m in quality:
            iv = s.intervals.get(m)
            ends += [iv.low, iv.high] if iv is not None and iv.known else ["", ""]
        deltas: list[Any] = []
        for m in quality:
            d = s.differences.get(m)
            known = d is not None and d.known
            deltas += (
                [d.estimate, d.low, d.high, *p_columns(d), d.distinguishable]
                if d is not None and known
                else [d.estimate if d is not None else "", "", "", "", "", "", ""]
            )
        rows.append(
            [
                s.variant,
                " ".join(map(str, s.seeds)),
                " ".join(map(str, s.diverged)),
                *values,
                *ends,
                s.baseline or "",
                *deltas,
                s.eval_samples or "",
                " ".join(f"{lr:g}" for lr in s.lrs),
                *(extra[1][index] if extra else []),
            ]
        )
    write_csv_rows(path, rows)


def p_columns(iv: Interval) -> list[Any]:
    """The raw p-value, the adjusted one and the adjustment's name, as CSV cells (empty when not known)."""
    raw = iv.p_value
    return [
        raw if math.isfinite(raw) else "",
        iv.p_adjusted if iv.p_adjusted is not None else "",
        iv.adjustment or "",
    ]


def summary_dict(s: VariantSummary) -> dict[str, Any]:
    """One variant's summary as JSON data: what results.json and ``bertblocks --json ablate`` print."""
    return {
        "variant": s.variant,
        "overrides": s.overrides,
        "seeds": s.seeds,
        "mean": s.mean,
        "std": s.std,
        "intervals": {m: iv.as_dict() for m, iv in s.intervals.items()},
        "baseline": s.baseline,
        "differences": {m: {**iv.as_dict(), "distinguishable": iv.distinguishable} for m, iv in s.differences.items()},
        "pairs": {
            m: {other: {**iv.as_dict(), "distinguishable": iv.distinguishable} for other, iv in pairs.items()}
            for m, pairs in s.pairs.items()
        },
        "eval_samples": s.eval_samples,
        "eval_sentences": s.eval_clusters,
        "lrs": s.lrs,
        "load_average": s.load_average,
        "cpus": s.cpus,
        "budget": s.budget,
        "eval_unit": s.eval_unit,
        "eval_rows": s.eval_rows,
        "eval_rows_asked": s.eval_rows_asked,
        "notes": s.notes,
        "diverged_seeds": s.diverged,
        "downstream": {key: entry.as_dict() for key, entry in s.downstream.items()},
    }


def write_json(
    path: Path,
    title: str,
    summaries: list[VariantSummary],
    records: list[dict[str, Any]],
    *,
    downstream: list[dict[str, Any]] | None = None,
    comparisons: dict[str, Any] | None = None,
    controls: Sequence[Any] = (),
    control_runs: Sequence[dict[str, Any]] = (),
) -> None:
    """Summaries (with intervals and paired differences) and every run's record; with ``downstream``, each
    variant's fine-tuning records too (``downstream_runs``); ``comparisons``: the study's ``comparisons`` and
    ``adjust`` settings, so that a table rebuilt from the file decides as the run did; ``controls``: the
    downstream control rows (:func:`~bertblocks.ablation.downstream.controls`), and ``control_runs`` the
    from-scratch control's fine-tuning records."""
    data = {
        "study": title,
        **({"comparisons": comparisons} if comparisons is not None else {}),
        "variants": [
            {
                **summary_dict(s),
                "runs": sorted((r for r in records if r["variant"] == s.variant), key=lambda r: r["seed"]),
                **({"downstream_runs": [r for r in downstream if r["variant"] == s.variant]} if downstream else {}),
            }
            for s in summaries
        ],
        **({"controls": [c.as_dict() for c in controls]} if controls else {}),
        **({"control_runs": list(control_runs)} if control_runs else {}),
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
    """One panel per metric: bars for costs, points for quality (zoomed); error bars: the 95% interval for
    quality metrics, the std over seeds for costs."""
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
        # quality metrics: the interval's half-width; costs: the std over seeds
        stds = [
            s.intervals[metric].half_width
            if metric in s.intervals and s.intervals[metric].known
            else s.std.get(metric, 0.0)
            for s in summaries
        ]
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
    save_figure(fig, path)


def save_figure(fig: Any, path: Path) -> None:
    """Write a matplotlib figure to ``path`` as a PNG (atomically: a crash leaves the old file or none) and close
    it."""
    import matplotlib.pyplot as plt

    try:
        image = io.BytesIO()
        fig.savefig(image, dpi=110, format="png")
    finally:
        plt.close(fig)
    write_bytes(path, image.getvalue())
