"""Which differences a study's report decides on, and the family-wise adjustment of those decisions.

A report prints many paired differences (Δ): one per variant for the pre-training table's Δ column, one per
variant and downstream task metric, and with ``comparisons: all-pairs`` one per pair of variants for each of
those metrics. Each Δ alone is marked ``≈`` when its 95% interval contains 0, but over a family of 15 such
tests a false "resolved" becomes likely (about 1 − 0.95¹⁵ ≈ 54% with no true difference at all). So every Δ
the report shows is one family, and its decisions come from p-values adjusted over that family
(:func:`bertblocks.ablation.stats.adjust`: Holm–Bonferroni by default, Benjamini–Hochberg or none on
request). The intervals stay unadjusted 95% intervals (the spread of each estimate); the ``≈`` marks and the
``distinguishable`` columns of results.csv and results.json follow the adjusted decision, since they all ask
:attr:`~bertblocks.ablation.stats.Interval.distinguishable`.

:func:`decide` is the one step that does this; the runner and :mod:`~bertblocks.ablation.doctables` both
call it after :func:`~bertblocks.ablation.report.summarize` and
:func:`~bertblocks.ablation.downstream.attach`, so a table rebuilt from results.json decides as the run did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .stats import LEVEL, SHORT_NAMES, Interval, adjust_family, paired_difference

if TYPE_CHECKING:
    from .downstream import ControlRow
    from .report import VariantSummary

#: ``comparisons:`` scopes
SCOPES = ("baseline", "all-pairs")


@dataclass(frozen=True)
class Comparison:
    """One Δ of the family: ``variant − against`` on ``metric`` (``eval_loss`` or ``task/metric``)."""

    metric: str
    variant: str
    against: str
    difference: Interval


def decide(
    summaries: list[VariantSummary],
    records: list[dict[str, Any]],
    downstream_records: list[dict[str, Any]],
    *,
    scope: str = "baseline",
    method: str = "holm",
    level: float = LEVEL,
) -> list[Comparison]:
    """Adjust every Δ the report shows as one family, in place; returns the family.

    Against the baseline: the Δ column's metric of each variant (see
    :func:`~bertblocks.ablation.report.primary`) and each downstream metric. With ``scope="all-pairs"``,
    also every pair of the other variants (``later − earlier`` in study order), kept in each summary's
    ``pairs`` (metric → the earlier variant → Δ).

    Args:
        summaries: the study's summaries, downstream entries attached.
        records: the pre-training run records (for the pairs' differences).
        downstream_records: the fine-tuning records (for the pairs' downstream differences).
        scope: ``baseline`` or ``all-pairs``.
        method: ``holm``, ``bh`` or ``none``.
        level: the confidence level (the family's alpha is ``1 − level``).

    Raises:
        ValueError: an unknown scope or method.
    """
    from . import downstream, report

    if scope not in SCOPES:
        raise InputError(f"unknown comparisons scope {scope!r}; choose one of {', '.join(SCOPES)}")
    primary = report.primary(summaries)
    for s in summaries:
        s.pairs = {}
    family: list[Comparison] = []
    for s in summaries:
        if s.baseline is None:
            continue
        if primary is not None and primary in s.differences:
            family.append(Comparison(primary, s.variant, s.baseline, s.differences[primary]))
        for key, entry in s.downstream.items():
            if entry.difference is not None:
                family.append(Comparison(key, s.variant, s.baseline, entry.difference))
    if scope == "all-pairs":
        baseline = next((s.baseline for s in summaries if s.baseline), None)
        others = [s for s in summaries if s.variant != baseline]
        runs = {s.variant: [r for r in records if r["variant"] == s.variant] for s in summaries}
        for j, later in enumerate(others):
            for earlier in others[:j]:
                if primary is not None:
                    d = paired_difference(
                        {r["seed"]: report.run_samples(r, primary) for r in runs[later.variant]},
                        {r["seed"]: report.run_samples(r, primary) for r in runs[earlier.variant]},
                        report.seed_metrics(runs[later.variant], primary),
                        report.seed_metrics(runs[earlier.variant], primary),
                        level,
                        clusters=report.run_clusters(runs[later.variant] + runs[earlier.variant], primary),
                    )
                    if d is not None:
                        family.append(Comparison(primary, later.variant, earlier.variant, d))
                for key in later.downstream:
                    d = downstream.pair_difference(downstream_records, key, later.variant, earlier.variant, level)
                    if d is not None:
                        family.append(Comparison(key, later.variant, earlier.variant, d))
    adjusted = adjust_family([c.difference for c in family], method)
    out = [Comparison(c.metric, c.variant, c.against, iv) for c, iv in zip(family, adjusted, strict=True)]
    by_name = {s.variant: s for s in summaries}
    for c in out:
        s = by_name[c.variant]
        if c.against == s.baseline and c.metric in s.differences and c.metric == primary:
            s.differences[c.metric] = c.difference
        elif c.against == s.baseline and c.metric in s.downstream:
            s.downstream[c.metric].difference = c.difference
        else:
            s.pairs.setdefault(c.metric, {})[c.against] = c.difference
    return out


def verdict(summaries: list[VariantSummary]) -> str | None:
    """One paragraph, from the numbers, on what survives the adjustment: the Δ resolved after it, and those
    whose own interval excludes 0 but that the family's decision does not resolve."""
    from .report import METRICS

    def name(metric: str) -> str:
        return METRICS[metric][0] if metric in METRICS else metric.replace("/", " ")

    found: list[tuple[str, str, Interval]] = []  # (what, against, Δ)
    for s in summaries:
        for metric, iv in s.differences.items():
            if iv.adjustment is not None:
                found.append((f"{name(metric)} of {s.variant}", s.baseline or "", iv))
        for key, entry in s.downstream.items():
            if entry.difference is not None and entry.difference.adjustment is not None:
                found.append((f"{name(key)} of {s.variant}", s.baseline or "", entry.difference))
        for metric, pairs in s.pairs.items():
            for other, iv in pairs.items():
                found.append((f"{name(metric)} of {s.variant}", other, iv))
    if not found:
        return None
    method = SHORT_NAMES[found[0][2].adjustment or "none"]
    survive = [f"{what} vs {against} ({_p(iv)})" for what, against, iv in found if iv.distinguishable]
    lost = [
        f"{what} vs {against} ({_p(iv)})"
        for what, against, iv in found
        if not iv.distinguishable and iv.known and not iv.contains(0.0)
    ]
    text = f"verdict: of {len(found)} Δ, " + (
        f"{len(survive)} resolved after {method}: {'; '.join(survive)}" if survive else f"none resolved after {method}"
    )
    if lost:
        text += f". Resolved by their own interval but not after {method}: {'; '.join(lost)}"
    return text + "."


def _p(iv: Interval) -> str:
    adjusted = f", adjusted {_figure(iv.p_adjusted)}" if iv.p_adjusted is not None else ""
    return f"p {_figure(iv.p_value)}{adjusted}"


def _figure(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def full_table(title: str, summaries: list[VariantSummary], controls: Sequence[ControlRow] = ()) -> str:
    """The whole report as text: the pre-training table (with its pairs block), the downstream block with its
    control rows, and the verdict; what the runner prints and :mod:`~bertblocks.ablation.doctables` writes into
    a page."""
    from . import downstream, report

    parts = [
        report.format_table(title, summaries),
        downstream.format_table(summaries, controls),
        verdict(summaries) or "",
    ]
    return "\n\n".join(part for part in parts if part)
