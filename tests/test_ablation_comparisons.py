"""Multiple comparisons in ablation reports: Holm–Bonferroni and Benjamini–Hochberg decisions against
written-out references on random p-value sets, p-values that agree with the intervals, and a report whose
``≈`` marks, CSV and JSON follow the adjusted decision over every Δ it shows (all pairs included)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import random
import statistics
from typing import Any

import pytest

from bertblocks.ablation.comparisons import decide, full_table, verdict
from bertblocks.ablation.doctables import table_from_results
from bertblocks.ablation.report import format_table, summarize, write_csv, write_json
from bertblocks.ablation.stats import adjust, interval, t_cdf


# ------------------------------------------------------------------------ written-out reference procedures
def holm_rejects(p: list[float], alpha: float) -> set[int]:
    """Holm's step-down procedure as textbooks state it: walk the sorted p-values, reject while
    ``p_(k) ≤ alpha / (m − k + 1)``, stop at the first that is not."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    rejected: set[int] = set()
    for k, i in enumerate(order, 1):
        if p[i] > alpha / (len(p) - k + 1):
            break
        rejected.add(i)
    return rejected


def bh_rejects(p: list[float], alpha: float) -> set[int]:
    """Benjamini–Hochberg's step-up procedure: the largest ``k`` with ``p_(k) ≤ k·alpha/m``; reject the ``k``
    smallest."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    largest = max((k for k, i in enumerate(order, 1) if p[i] <= k * alpha / len(p)), default=0)
    return set(order[:largest])


@pytest.mark.parametrize(("method", "reference"), [("holm", holm_rejects), ("bh", bh_rejects)])
def test_adjusted_decisions_equal_the_reference_procedure_on_random_p_value_sets(method, reference):
    rng = random.Random(2026)
    for _ in range(500):
        m = rng.randint(1, 20)
        # a mix of nulls (uniform) and real effects (near 0), with ties now and then
        p = [rng.random() if rng.random() < 0.6 else rng.random() ** 4 / 10 for _ in range(m)]
        if m > 2 and rng.random() < 0.2:
            p[1] = p[0]
        adjusted = adjust(p, method)
        for alpha in (0.01, 0.05, 0.1, 0.2):
            assert {i for i, a in enumerate(adjusted) if a <= alpha} == reference(p, alpha), (p, alpha)
        assert all(a >= raw * (1 - 1e-12) for a, raw in zip(adjusted, p, strict=True))  # never helps a test


def test_adjusted_p_values_equal_statsmodels_when_it_is_installed():
    # a cross-check, not a dependency: the written-out references above are the test that always runs
    if importlib.util.find_spec("statsmodels") is None:
        return
    from statsmodels.stats.multitest import multipletests

    rng = random.Random(5)
    for _ in range(100):
        p = [rng.random() ** 2 for _ in range(rng.randint(1, 15))]
        for method, theirs in (("holm", "holm"), ("bh", "fdr_bh")):
            assert adjust(p, method) == pytest.approx(list(multipletests(p, method=theirs)[1]), abs=1e-12)


def test_untestable_differences_stay_out_of_the_family():
    assert adjust([0.01, math.nan, 0.04], "holm") == [0.02, pytest.approx(math.nan, nan_ok=True), 0.04]
    assert adjust([0.2, 0.01], "none") == [0.2, 0.01]
    with pytest.raises(ValueError, match="holm, bh, none"):
        adjust([0.1], "bonferonni")


def test_the_p_value_is_the_t_test_of_the_interval():
    rng = random.Random(11)
    for _ in range(50):
        values = [rng.gauss(0.3, 1) for _ in range(rng.randint(2, 8))]
        iv = interval(None, values)
        # a one-sample t-test, written out: t = mean / (sd / √n), n − 1 degrees of freedom
        t = statistics.fmean(values) / (statistics.stdev(values) / math.sqrt(len(values)))
        assert iv.p_value == pytest.approx(2 * t_cdf(-abs(t), len(values) - 1), rel=1e-6)
        # and it decides as the interval does: below 5% exactly when 0 lies outside the 95% interval
        if abs(iv.p_value - 0.05) > 1e-6:
            assert (iv.p_value < 0.05) == (not iv.contains(0.0))
    if importlib.util.find_spec("scipy") is not None:
        from scipy import stats

        values = [0.4, -0.1, 0.9, 0.3]
        assert interval(None, values).p_value == pytest.approx(stats.ttest_1samp(values, 0).pvalue, rel=1e-6)


# ------------------------------------------------------------------------------------------- a report
def record(variant: str, seed: int, losses: list[float]) -> dict[str, Any]:
    metrics = {"params": 10, "eval_loss": statistics.fmean(losses)}
    return {
        "variant": variant,
        "seed": seed,
        "fingerprint": "x",
        "status": "ok",
        "metrics": metrics,
        "eval_samples": {"unit": "token", "loss": losses},
    }


SHIFTS = {"base": 0.0, "big": -0.6, "small": -0.05, "none1": 0.0, "none2": 0.0, "none3": 0.0}


def records(seed: int = 9) -> list[dict[str, Any]]:
    """Six variants on 300 shared tokens, three seeds: one large gain, one small, three without a change."""
    rng = random.Random(seed)
    tokens = [rng.expovariate(0.25) for _ in range(300)]
    out = []
    for s in range(3):
        for name, shift in SHIFTS.items():
            out.append(record(name, s, [t + shift + rng.gauss(0, 0.3) for t in tokens]))
    return out


def report(scope: str, method: str, seed: int = 9):
    runs = records(seed)
    summaries = summarize([(n, {}) for n in SHIFTS], runs, baseline="base")
    family = decide(summaries, runs, [], scope=scope, method=method)
    return summaries, family


def test_marks_follow_the_adjusted_decision_not_the_raw_interval():
    # find a draw where a raw 95% interval excludes 0 but Holm over the family does not resolve it
    for seed in range(200):
        summaries, family = report("baseline", "holm", seed)
        raw_only = [c for c in family if not c.difference.contains(0.0) and not c.difference.distinguishable]
        if raw_only:
            break
    else:
        pytest.fail("no draw with a raw-only difference")
    assert len(family) == len(SHIFTS) - 1
    assert all(c.difference.adjustment == "holm" and c.difference.family == 5 for c in family)
    assert all(
        c.difference.p_adjusted == pytest.approx(a)
        for c, a in zip(family, adjust([c.difference.p_value for c in family], "holm"), strict=True)
    )
    table = format_table("t", summaries)
    assert "decisions: Holm–Bonferroni over all 5 Δ of this report" in table
    assert "Δ eval loss vs base (Holm)" in table
    row = next(line for line in table.splitlines() if line.startswith(raw_only[0].variant + " "))
    assert "≈" in row  # the interval excludes 0, the family's decision does not resolve it: marked ≈
    big = next(line for line in table.splitlines() if line.startswith("big "))
    assert "≈" not in big


def test_csv_and_json_hold_raw_and_adjusted_p_values(tmp_path):
    runs = records()
    summaries = summarize([(n, {}) for n in SHIFTS], runs, baseline="base")
    decide(summaries, runs, [], scope="all-pairs", method="bh")
    write_csv(tmp_path / "results.csv", summaries)
    with (tmp_path / "results.csv").open() as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    big = summaries[1].differences["eval_loss"]
    assert float(rows["big"]["delta_eval_loss_p"]) == pytest.approx(big.p_value)
    assert float(rows["big"]["delta_eval_loss_p_adjusted"]) == pytest.approx(big.p_adjusted)
    assert rows["big"]["delta_eval_loss_adjustment"] == "bh"
    assert rows["big"]["delta_eval_loss_distinguishable"] == "True"
    assert rows["base"]["delta_eval_loss_p"] == ""

    write_json(tmp_path / "results.json", "t", summaries, runs, comparisons={"scope": "all-pairs", "adjust": "bh"})
    data = json.loads((tmp_path / "results.json").read_text())
    entry = data["variants"][2]["differences"]["eval_loss"]
    assert {"p_value", "p_adjusted", "adjustment", "family", "distinguishable"} <= set(entry)
    assert entry["family"] == 5 + 10  # five against the baseline, ten pairs of the other five
    pair = data["variants"][2]["pairs"]["eval_loss"]["big"]  # small − big
    assert pair["estimate"] > 0.4
    assert pair["distinguishable"] is True
    # the table rebuilt from results.json decides as the run did
    assert table_from_results(tmp_path / "results.json") == full_table("t", summaries)


def test_all_pairs_puts_every_pair_in_the_table_and_the_family():
    summaries, family = report("all-pairs", "holm")
    assert len(family) == 5 + 10
    pairs = {(c.variant, c.against) for c in family}
    assert {("small", "big"), ("none3", "none1"), ("big", "base")} <= pairs
    table = format_table("t", summaries)
    assert "pairs of variants besides the baseline (comparisons: all-pairs)" in table
    line = next(x for x in table.splitlines() if x.startswith("none2 − none1"))
    assert line.rstrip().endswith("≈")
    line = next(x for x in table.splitlines() if x.startswith("small − big"))
    assert "≈" not in line
    baseline_only, _ = report("baseline", "holm")
    assert "pairs of variants" not in format_table("t", baseline_only)
    with pytest.raises(ValueError, match="baseline, all-pairs"):
        decide(baseline_only, records(), [], scope="everything")


def test_the_verdict_says_what_survives_the_adjustment():
    for seed in range(200):
        summaries, family = report("baseline", "holm", seed)
        if any(not c.difference.contains(0.0) and not c.difference.distinguishable for c in family):
            break
    text = verdict(summaries)
    assert text.startswith("verdict: of 5 Δ, ")
    assert "eval loss of big vs base (p " in text.split(". Resolved by")[0]  # resolved after Holm
    lost = next(c for c in family if not c.difference.contains(0.0) and not c.difference.distinguishable)
    assert f"eval loss of {lost.variant} vs base" in text.split("but not after Holm: ")[1]
    assert text in full_table("t", summaries)
