"""Confidence intervals for a study's quality numbers, from both sources of noise: seeds and eval samples.

Every run of a study evaluates on the *same* held-out tokens (the eval set is masked with one fixed
generator), so a run gives a row of per-token losses, and the runs of a variant give a seeds × tokens
matrix ``y[s, t]``. Its grand mean estimates the variant's expected loss over seeds *and* over the text
the eval set was drawn from. Two things make it noisy:

* the seed (initial weights, batch order, masking, dropout): averaging over more seeds shrinks it;
* the eval sample: the tokens are one draw of the text, shared by every seed, so more seeds do *not*
  shrink this part; only more eval tokens do.

The variance of the grand mean of such a crossed design is estimated by

    se² = var_s(row means) / S  +  max(0, var_t(column means) / T  −  MS_residual / (S·T))

(both variances hold the seed-by-token interaction; the residual mean square of the two-way layout takes
the second copy out, so the estimate is unbiased for a two-way random-effects layout), and the interval
is ``mean ± t · se`` with Welch–Satterthwaite degrees of freedom. With one seed only the eval-sample term
is known (the interval then says nothing about seed noise); without per-sample losses (a metric such as
the training loss, or a record of an older version) only the seed term is.

The eval tokens of one sentence share its difficulty: they are not independent draws. When the runs keep
each token's sentence, the rows are first turned into one pseudo-value per sentence (:func:`cluster_rows`),
so that sentences are the samples of the layout and the interval does not claim the precision of
independent tokens (resampling sentences, not tokens).

A *paired* difference against a baseline variant applies the same estimator to ``y_v[s, t] − y_b[s, t]``
over the seeds both have: the same seed and the same eval token on both sides, so what they share cancels.
Its estimate is the mean of the per-seed differences of the metric. An interval that contains 0 marks the
two variants as not distinguishable at that level.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import InputError

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """An estimate with a two-sided confidence interval.

    Attributes:
        estimate: the mean (over seeds and eval samples).
        low, high: the interval's ends; ``nan`` when nothing is known about the spread (one seed and no
            per-sample values).
        seeds: how many seeds it rests on.
        samples: how many eval samples (tokens, or examples) per seed it rests on; 0 when unknown.
        sources: which noise it accounts for: ``seeds+samples``, ``samples`` (one seed), ``seeds`` (no
            per-sample values), or ``none``.
        level: the confidence level.
        df: the degrees of freedom of its t quantile (``nan`` when not known, ``inf`` for a variance known
            exactly).
        p_adjusted: for a difference, its p-value adjusted over the family of differences its table holds
            (:func:`adjust`); ``None`` while it has not been adjusted.
        adjustment: the method of ``p_adjusted`` (``holm``, ``bh`` or ``none``).
        family: how many differences ``p_adjusted`` was adjusted over.
    """

    estimate: float
    low: float
    high: float
    seeds: int
    samples: int
    sources: str
    level: float = LEVEL
    df: float = math.nan
    p_adjusted: float | None = None
    adjustment: str | None = None
    family: int = 0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def known(self) -> bool:
        """Whether the interval has finite ends."""
        return math.isfinite(self.low) and math.isfinite(self.high)

    def contains(self, value: float) -> bool:
        return self.known and self.low <= value <= self.high

    @property
    def p_value(self) -> float:
        """The two-sided p-value of "the true value is 0", from the same t distribution as the interval: it is
        below ``1 − level`` exactly when the interval excludes 0. ``nan`` when the interval is not known."""
        if not self.known:
            return math.nan
        if self.half_width == 0:  # no spread at all: a difference is certain, a zero is not one
            return 0.0 if self.estimate != 0 else 1.0
        if not math.isfinite(self.df):
            return math.nan
        se = self.half_width / t_quantile(0.5 + self.level / 2, self.df)
        return min(1.0, 2 * t_cdf(-abs(self.estimate) / se, self.df))

    @property
    def distinguishable(self) -> bool:
        """Whether this difference is told apart from 0: by its adjusted p-value once it has one (the family's
        decision), else by whether its interval excludes 0 (an interval that is not known never is)."""
        if self.p_adjusted is not None:
            return self.p_adjusted <= 1 - self.level
        return self.known and not self.contains(0.0)

    def as_dict(self) -> dict[str, Any]:
        """The fields, the half-width and the raw p-value, with ``None`` for a number that is not known (strict
        JSON)."""
        data = {**asdict(self), "half_width": self.half_width, "p_value": self.p_value}
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in data.items()}


def interval(
    per_sample: Sequence[Sequence[float]] | None,
    per_seed: Sequence[float],
    level: float = LEVEL,
    *,
    clusters: Sequence[int] | None = None,
) -> Interval:
    """The interval of the grand mean of a seeds × samples matrix (see the module doc).

    Args:
        per_sample: one row of per-sample values per seed, all rows equally long (the same eval samples);
            ``None`` when the runs kept no per-sample values.
        per_seed: the metric of each seed (used when ``per_sample`` is ``None``).
        level: confidence level, e.g. 0.95.
        clusters: the cluster (sentence) of each sample: the samples of one cluster are not independent, so
            the interval treats clusters as the units (:func:`cluster_rows`); ``samples`` then counts them.
    """
    if per_sample is not None and per_sample and len({len(row) for row in per_sample}) == 1 and per_sample[0]:
        rows = [[float(v) for v in row] for row in per_sample]
        if clusters is not None:
            rows = cluster_rows(rows, clusters)
        seeds, samples = len(rows), len(rows[0])
        row_means = [math.fsum(row) / samples for row in rows]
        estimate = math.fsum(row_means) / seeds
        terms: list[tuple[float, int]] = []  # (variance of the mean, degrees of freedom)
        columns = [math.fsum(col) / seeds for col in zip(*rows, strict=True)]
        if seeds > 1:
            # the spread of the seeds' means: seed noise, and the seed × sample interaction averaged over T
            terms.append((statistics.variance(row_means) / seeds, seeds - 1))
        if samples > 1:
            sample_term = statistics.variance(columns) / samples
            if seeds > 1:
                # the column means also hold the interaction (averaged over S), already counted above: take
                # it out (the residual mean square of the two-way layout estimates it); never below zero
                residual = math.fsum(
                    (y - row_means[s] - columns[t] + estimate) ** 2
                    for s, row in enumerate(rows)
                    for t, y in enumerate(row)
                ) / ((seeds - 1) * (samples - 1))
                sample_term = max(0.0, sample_term - residual / (seeds * samples))
            terms.append((sample_term, samples - 1))
        sources = "seeds+samples" if seeds > 1 else "samples"
    else:
        values = [float(v) for v in per_seed]
        seeds, samples = len(values), 0
        estimate = math.fsum(values) / seeds if seeds else math.nan
        terms = [(statistics.variance(values) / seeds, seeds - 1)] if seeds > 1 else []
        sources = "seeds" if seeds > 1 else "none"
    if not terms:
        return Interval(estimate, math.nan, math.nan, seeds, samples, "none", level)
    var = sum(v for v, _ in terms)
    if var == 0:
        return Interval(estimate, estimate, estimate, seeds, samples, sources, level, math.inf)
    # Welch–Satterthwaite: the degrees of freedom of a sum of independently estimated variances
    df = var**2 / sum(v**2 / d for v, d in terms)
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(var)
    return Interval(estimate, estimate - half, estimate + half, seeds, samples, sources, level, df)


def paired_difference(
    variant: dict[int, Sequence[float] | None],
    baseline: dict[int, Sequence[float] | None],
    variant_metric: dict[int, float],
    baseline_metric: dict[int, float],
    level: float = LEVEL,
    *,
    clusters: Sequence[int] | None = None,
) -> Interval | None:
    """``variant − baseline`` over the seeds both have, paired by seed and by eval sample.

    Args:
        variant, baseline: seed → that run's per-sample values (``None`` when the record has none).
        variant_metric, baseline_metric: seed → the run's metric (its mean over the samples).
        level: confidence level.
        clusters: the cluster (sentence) of each eval sample, as for :func:`interval`.

    Returns:
        The interval of the difference, or ``None`` when no seed is shared.
    """
    seeds = sorted(set(variant_metric) & set(baseline_metric))
    if not seeds:
        return None
    rows: list[list[float]] | None = []
    for seed in seeds:
        a, b = variant.get(seed), baseline.get(seed)
        if rows is None or a is None or b is None or len(a) != len(b):
            rows = None  # not the same samples on both sides: pair by seed only
            continue
        rows.append([float(x) - float(y) for x, y in zip(a, b, strict=True)])
    per_seed = [variant_metric[s] - baseline_metric[s] for s in seeds]
    return interval(rows, per_seed, level, clusters=clusters if rows is not None else None)


def cluster_rows(rows: Sequence[Sequence[float]], clusters: Sequence[int]) -> list[list[float]]:
    """Each row's per-sample values turned into one pseudo-value per cluster, so that the clusters (sentences),
    not the samples (tokens), are the independent units of the interval.

    A row's mean is a ratio, ``Σ_c T_c / N`` (``T_c`` the cluster's total, ``n_c`` its size, ``N = Σ n_c``); its
    linearisation gives cluster ``c`` the pseudo-value ``C·(T_c − m·n_c)/N + m`` (``m`` the row's mean, ``C``
    the cluster count), whose mean over the clusters is ``m`` exactly, and whose variance over clusters
    divided by ``C`` is the usual cluster-robust (sandwich) variance of a mean over clustered samples. The
    seeds × clusters matrix keeps the crossed layout of the module doc (every seed sees the same sentences).

    Raises:
        ValueError: a row whose length is not the number of cluster ids.
    """
    if any(len(row) != len(clusters) for row in rows):
        raise InputError(f"need one sentence id per value of every row; got {len(clusters)} ids")
    index: dict[int, int] = {}
    for c in clusters:
        index.setdefault(c, len(index))
    counts = [0] * len(index)
    for c in clusters:
        counts[index[c]] += 1
    total, count = len(clusters), len(index)
    out = []
    for row in rows:
        sums = [0.0] * count
        for value, c in zip(row, clusters, strict=True):
            sums[index[c]] += value
        mean = math.fsum(row) / total
        out.append([count * (t - mean * n) / total + mean for t, n in zip(sums, counts, strict=True)])
    return out


# ------------------------------------------------------------------------------ multiple comparisons
#: the adjustments :func:`adjust` knows: Holm–Bonferroni (family-wise error), Benjamini–Hochberg (false
#: discovery rate), and none (each difference at the level alone)
ADJUSTMENTS = ("holm", "bh", "none")
#: how the adjustments are named in tables
ADJUSTMENT_NAMES = {"holm": "Holm–Bonferroni", "bh": "Benjamini–Hochberg", "none": "no adjustment"}
#: and in a Δ column's header
SHORT_NAMES = {"holm": "Holm", "bh": "BH", "none": "unadjusted"}


def adjust(p_values: Sequence[float], method: str) -> list[float]:
    """Adjusted p-values of a family of tests, in the order given; reject where ``adjusted ≤ alpha``.

    ``holm``: step-down Holm–Bonferroni, ``max_{j ≤ i} min(1, (m − j + 1) p_(j))`` over the sorted p-values; it
    keeps the chance of *any* false "resolved" in the family at alpha, whatever the dependence between tests.
    ``bh``: step-up Benjamini–Hochberg, ``min_{j ≥ i} min(1, m p_(j) / j)``; it keeps the expected share of
    false "resolved" among the resolved at alpha (independent or positively dependent tests). ``none``: the
    p-values unchanged. A ``nan`` p-value (a difference whose interval is not known) is no test: it stays
    ``nan`` and does not count in ``m``.

    Raises:
        ValueError: an unknown method.
    """
    if method not in ADJUSTMENTS:
        raise InputError(f"unknown adjustment {method!r}; choose one of {', '.join(ADJUSTMENTS)}")
    out = [math.nan] * len(p_values)
    tested = sorted((p, i) for i, p in enumerate(p_values) if math.isfinite(p))
    m = len(tested)
    if method == "none":
        for p, i in tested:
            out[i] = p
    elif method == "holm":
        running = 0.0
        for rank, (p, i) in enumerate(tested):
            running = max(running, min(1.0, (m - rank) * p))
            out[i] = running
    else:
        running = 1.0
        for rank in reversed(range(m)):
            p, i = tested[rank]
            running = min(running, min(1.0, m * p / (rank + 1)))
            out[i] = running
    return out


def adjust_family(intervals: Sequence[Interval], method: str) -> list[Interval]:
    """The differences of one family with their adjusted p-values (see :func:`adjust`) set; order kept."""
    adjusted = adjust([iv.p_value for iv in intervals], method)
    m = sum(math.isfinite(p) for p in adjusted)
    return [
        replace(iv, p_adjusted=p if math.isfinite(p) else None, adjustment=method, family=m)
        for iv, p in zip(intervals, adjusted, strict=True)
    ]


# ------------------------------------------------------------------------------ Student's t, no scipy
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` (real, > 0) degrees of freedom."""
    if not 0 < p < 1 or df <= 0:
        raise InputError(f"need 0 < p < 1 and df > 0; got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:  # bracket, then bisect (the CDF is monotone)
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function, through the regularised incomplete beta function."""
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1 - tail if t > 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)`` (continued fraction, as in Numerical Recipes)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h
