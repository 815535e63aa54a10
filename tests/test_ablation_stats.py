"""Uncertainty in ablation reports: intervals that combine seed and eval-set noise (checked for coverage on
synthetic studies of known variance), paired differences against a baseline, the per-token eval losses
they rest on, a too-small eval set named, the nested-options hint, and the 'used' parameter count."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from test_ablation import write_study

from bertblocks.ablation import StudyError, load_study, run_study
from bertblocks.ablation.data import get_tokenizer, load_texts, prepare
from bertblocks.ablation.measure import used_parameters
from bertblocks.ablation.report import format_table, summarize
from bertblocks.ablation.stats import interval, paired_difference, t_quantile
from bertblocks.ablation.study import TrainSpec
from bertblocks.ablation.training import evaluate, task_model
from bertblocks.config_files import apply_overrides, load_config
from bertblocks.zoo import create_model

TRUE_MEAN = 3.0


def synthetic_study(rng: random.Random, seeds: int, tokens: int, seed_sd: float, token_sd: float, noise_sd: float):
    """A seeds × tokens matrix of losses: ``TRUE_MEAN + a_seed + b_token + e``, the layout of a real study
    (every seed evaluated on the same tokens), with known variance components."""
    a = [rng.gauss(0, seed_sd) for _ in range(seeds)]
    b = [rng.gauss(0, token_sd) for _ in range(tokens)]
    return [[TRUE_MEAN + a[s] + b[t] + rng.gauss(0, noise_sd) for t in range(tokens)] for s in range(seeds)]


def coverage(rng: random.Random, trials: int, *, per_token: bool, **sizes: Any) -> float:
    hits = 0
    for _ in range(trials):
        matrix = synthetic_study(rng, **sizes)
        per_seed = [sum(row) / len(row) for row in matrix]
        iv = interval(matrix if per_token else None, per_seed)
        hits += iv.low <= TRUE_MEAN <= iv.high
    return hits / trials


# ------------------------------------------------------------------------------------------------ stats
def test_t_quantiles_match_the_tables():
    # two-sided 95%: the textbook values
    for df, expected in [(1, 12.7062), (2, 4.3027), (5, 2.5706), (30, 2.0423), (1e6, 1.9600)]:
        assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.025, 4) == pytest.approx(-t_quantile(0.975, 4))


@pytest.mark.parametrize(
    "sizes",
    [
        # seed noise and eval-token noise both matter (the case of the modern-encoder study)
        {"seeds": 3, "tokens": 100, "seed_sd": 0.05, "token_sd": 0.5, "noise_sd": 0.5},
        # eval-token noise dominates: more seeds would not help
        {"seeds": 3, "tokens": 100, "seed_sd": 0.01, "token_sd": 1.0, "noise_sd": 0.3},
        # seed noise dominates
        {"seeds": 5, "tokens": 100, "seed_sd": 0.2, "token_sd": 0.2, "noise_sd": 0.5},
    ],
)
def test_the_95_percent_interval_covers_the_true_mean_95_percent_of_the_time(sizes):
    trials = 1000
    margin = 3 * math.sqrt(0.95 * 0.05 / trials)  # three binomial standard errors: ±0.021
    observed = coverage(random.Random(1234), trials, per_token=True, **sizes)
    assert abs(observed - 0.95) <= margin, observed


def test_an_interval_over_seeds_alone_misses_the_eval_set_noise():
    # what the report showed before (a spread over seeds only): with the eval tokens shared by every seed,
    # their noise never averages out, and an interval blind to it covers far less than it claims
    sizes = {"seeds": 3, "tokens": 100, "seed_sd": 0.01, "token_sd": 1.0, "noise_sd": 0.3}
    assert coverage(random.Random(1234), 400, per_token=False, **sizes) < 0.5


def test_one_seed_gives_an_eval_set_interval_and_no_seed_interval():
    rng = random.Random(0)
    only = interval([[rng.gauss(0, 1) for _ in range(200)]], [0.0])
    assert only.sources == "samples"
    assert only.known
    assert only.half_width == pytest.approx(t_quantile(0.975, 199) * 1 / math.sqrt(200), rel=0.2)
    assert not interval(None, [4.0]).known  # one seed, no per-token values: nothing known


def test_a_paired_difference_is_the_mean_of_the_per_seed_differences():
    rng = random.Random(7)
    base = synthetic_study(rng, seeds=4, tokens=50, seed_sd=0.1, token_sd=1.0, noise_sd=0.2)
    other = [[v - 0.05 + rng.gauss(0, 0.2) for v in row] for row in base]
    seeds = [3, 5, 8, 13]
    mean = {s: sum(row) / len(row) for s, row in zip(seeds, other, strict=True)}
    base_mean = {s: sum(row) / len(row) for s, row in zip(seeds, base, strict=True)}
    diff = paired_difference(dict(zip(seeds, other, strict=True)), dict(zip(seeds, base, strict=True)), mean, base_mean)
    assert diff is not None
    expected = sum(mean[s] - base_mean[s] for s in seeds) / len(seeds)
    assert diff.estimate == pytest.approx(expected, abs=1e-12)
    # pairing cancels the token difficulty both share: far narrower than either variant's own interval
    assert diff.half_width < interval(base, list(base_mean.values())).half_width / 3
    # only the seeds both have are paired (here without per-token values: paired by seed alone)
    partial = paired_difference({3: None, 5: None}, {}, {3: 1.0, 5: 2.0}, {3: 0.5, 5: 0.5, 8: 9.0})
    assert partial is not None
    assert partial.seeds == 2
    assert partial.estimate == pytest.approx(1.0)


def record(variant: str, seed: int, losses: list[float] | None) -> dict[str, Any]:
    metrics: dict[str, Any] = {"params": 10, "eval_loss": sum(losses) / len(losses) if losses else 4.0}
    out = {"variant": variant, "seed": seed, "fingerprint": "x", "status": "ok", "metrics": metrics}
    if losses is not None:
        out["eval_samples"] = {"unit": "token", "loss": losses}
    return out


def test_the_table_marks_differences_it_cannot_tell_from_zero_and_says_what_it_rests_on():
    rng = random.Random(3)
    tokens = [rng.expovariate(0.25) for _ in range(300)]  # token difficulty, shared by every run
    records = []
    for seed in range(3):
        records.append(record("base", seed, [t + rng.gauss(0, 0.3) for t in tokens]))
        records.append(record("same", seed, [t + rng.gauss(0, 0.3) for t in tokens]))  # no real change
        records.append(record("better", seed, [t - 0.5 + rng.gauss(0, 0.3) for t in tokens]))
    summaries = summarize([("base", {}), ("same", {}), ("better", {})], records, baseline="base")
    table = format_table("t", summaries)
    rows = {line.split()[0]: line for line in table.splitlines()[3:6]}
    assert "(baseline)" in rows["base"]
    assert rows["same"].split()[-2] == "≈"
    assert "≈" not in rows["better"]
    assert "Δ eval loss vs base" in table
    assert rows["better"].split()[-1] == "300"  # eval tokens per seed
    by_name = {s.variant: s for s in summaries}
    assert by_name["better"].differences["eval_loss"].high < 0
    assert by_name["same"].differences["eval_loss"].contains(0.0)
    assert by_name["base"].differences == {}
    assert by_name["better"].eval_samples == 300


def test_records_without_per_token_losses_still_summarise_over_seeds():
    # records of an older version hold no eval_samples: intervals over seeds only, and the table says so
    records = [record("a", s, None) | {"metrics": {"eval_loss": 4.0 + s / 10}} for s in range(3)]
    (summary,) = summarize([("a", {})], records)
    assert summary.intervals["eval_loss"].sources == "seeds"
    assert summary.eval_samples == 0
    assert "intervals over seeds only" in format_table("t", [summary])


# --------------------------------------------------------------------------------------- real studies
def tiny_study(folder: Path, **train: Any) -> Path:
    settings = {"task": "mlm", "steps": 2, "batch_size": 4, "seq_len": 16, "seeds": [0, 1], **train}
    return write_study(
        folder,
        vary={},
        variants={"abs": {"position.name": "absolute"}, "rel": {"position.name": "relative_key"}},
        measure={"batch": 1, "seq_len": 8, "repeats": 1, "warmup": 0, "metrics": ["params"]},
        train={k: v for k, v in settings.items() if v is not None},
        corpus={"sentences": 120},
        tokenizer={"vocab_size": 200},
    )


def test_per_token_eval_losses_are_kept_and_average_to_the_eval_loss(tmp_path):
    result = run_study(tiny_study(tmp_path), tmp_path / "out", workers=0, progress=False, echo=None)
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "out" / "runs").glob("*.json"))]
    assert len(records) == 4
    counts = set()
    for rec in records:
        losses = rec["eval_samples"]["loss"]
        assert rec["eval_samples"]["unit"] == "token"
        # float32 per-token losses summed in double here: the tolerance policy's 1e-5 relative bound for losses
        assert sum(losses) / len(losses) == pytest.approx(rec["metrics"]["eval_loss"], rel=1e-5)
        counts.add(len(losses))
    assert len(counts) == 1  # the same masked tokens for every variant and seed
    (count,) = counts
    for summary in result.summaries:
        assert summary.eval_samples == count
        assert summary.intervals["eval_loss"].sources == "seeds+samples"
    assert "eval tokens" in result.table


def test_the_eval_loss_from_per_token_losses_equals_the_models_own_loss(tmp_path):
    study = load_study(tiny_study(tmp_path))
    texts, labels = load_texts(study)
    data = prepare(study, get_tokenizer(study, texts), texts, labels)
    spec = study.spec.train
    assert spec is not None
    config = load_config(apply_overrides(study.variants[0].config.model_dump(), {"vocab_size": data.vocab_size}))
    torch.manual_seed(0)
    model = task_model("mlm", config)
    result = evaluate(model, data, spec)
    # the previous way: the model's mean loss per batch, weighted by the batch's masked tokens
    from bertblocks.ablation.training import EVAL_SEED, _batch

    generator = torch.Generator().manual_seed(EVAL_SEED)
    total, weight = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(data.eval_ids), spec.batch_size):
            rows = torch.arange(start, min(start + spec.batch_size, len(data.eval_ids)))
            batch = _batch(data, rows, spec, generator, train=False)
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels)
            count = int((batch.labels != -100).sum())
            total, weight = total + float(out.loss) * count, weight + count
    assert result["eval_loss"] == pytest.approx(total / weight, rel=1e-5)
    assert len(result["eval_samples"]["loss"]) == weight
    assert result["eval_rows"] == len(data.eval_ids)  # eval_batches unset: the whole held-out set
    assert "eval_rows_asked" not in result


def test_an_eval_set_smaller_than_asked_is_named(tmp_path, caplog):
    study = tiny_study(tmp_path, eval_batches=50)  # 200 rows asked; 120 sentences hold out a handful
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        result = run_study(study, tmp_path / "out", workers=0, progress=False, echo=None)
    warning = next(r.getMessage() for r in caplog.records if "eval_batches" in r.getMessage())
    assert "train.eval_batches asks for 200 held-out rows" in warning
    rows = result.summaries[0].eval_rows
    assert rows is not None
    assert 0 < rows < 200
    assert f"but the eval set has only {rows}" in warning
    assert f"note: train.eval_batches asks for 200 held-out rows but the eval set has only {rows}" in result.table
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["variants"][0]["eval_rows_asked"] == 200


def test_an_eval_set_that_is_large_enough_is_not_warned_about(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        result = run_study(tiny_study(tmp_path, eval_batches=1), tmp_path / "out", workers=0, progress=False, echo=None)
    assert not [r for r in caplog.records if "eval_batches" in r.getMessage()]
    assert "eval_batches" not in result.table
    assert result.summaries[0].eval_rows == 4


def test_the_default_is_three_seeds():
    assert TrainSpec().seeds == [0, 1, 2]
    assert TrainSpec().eval_batches is None


# ------------------------------------------------------------------------------------ study validation
def test_component_options_nested_under_options_are_refused_with_the_way_to_write_them():
    study = {
        "base": "bert-tiny-uncased",
        "variants": {"rope": {"position": {"name": "rope", "options": {"interleaved": True}}}},
    }
    with pytest.raises(StudyError) as info:
        load_study(study)
    text = str(info.value)
    assert "variants.rope.position" in text
    assert "'position.options' is not a key of the config" in text
    assert "did you mean 'position'" not in text  # the old, self-referring hint
    assert "written beside its name" in text
    assert "position: {name: ..., OPTION: VALUE}" in text
    # the form the hint gives works
    fixed = {"base": "bert-tiny-uncased", "variants": {"rope": {"position": {"name": "rope", "interleaved": True}}}}
    position = load_study(fixed).variants[0].config.position
    assert position.name == "rope"
    assert position.options()["interleaved"] is True


def test_the_baseline_must_be_a_variant_and_sets_the_comparison(tmp_path):
    path = tiny_study(tmp_path)
    with pytest.raises(StudyError) as info:
        load_study(path, ["baseline=rell"])
    assert "baseline: no variant 'rell'; the study has: abs, rel (did you mean 'rel'?)" in str(info.value)
    assert load_study(path).baseline == "abs"
    assert load_study(path, ["baseline=rel"]).baseline == "rel"
    result = run_study(path, tmp_path / "out", overrides=["baseline=rel"], workers=0, progress=False, echo=None)
    assert "Δ eval loss vs rel" in result.table
    by_name = {s.variant: s for s in result.summaries}
    assert by_name["rel"].baseline is None
    assert by_name["abs"].baseline == "rel"


# ----------------------------------------------------------------------------------------- parameters
@pytest.mark.parametrize(
    ("position", "unused_rows"),
    [("absolute", lambda h, d: (512 - 64) * h), ("relative_key", lambda h, d: 2 * (1023 - 127) * d)],
)
def test_used_parameters_leave_out_the_position_rows_a_sequence_never_reaches(position, unused_rows):
    config = load_config(apply_overrides(load_config("bert-tiny-uncased").model_dump(), {"position.name": position}))
    model = create_model(config)
    total = sum(p.numel() for p in model.parameters())
    hidden, head_dim = config.hidden_size, config.hidden_size // config.encoder.attention.num_heads
    token_type_row = hidden  # segment 1 is never given
    assert used_parameters(model, config, 64) == total - unused_rows(hidden, head_dim) - token_type_row
    assert used_parameters(model, config, 512) == total - token_type_row
    assert all(p.grad is None for p in model.parameters())  # leaves no gradients behind


# ------------------------------------------------------------------------------------------ doc tables
def test_a_page_s_tables_are_rewritten_from_the_study_s_results(tmp_path):
    from bertblocks.ablation.doctables import DocTableError, main, update_page

    tiny_study(tmp_path / "study")
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    marker = "<!-- ablation-table: ../study/study.yaml --set train.steps=1 -->\n"
    page.write_text(f"# Results\n\n{marker}```text\nstale numbers\n```\n<!-- /ablation-table -->\n\nReading it.\n")
    out_root = tmp_path / "runs"
    with pytest.raises(DocTableError, match=r"no results at .*results\.json: run the study first"):
        update_page(page, out_root=out_root)
    (folder,) = update_page(page, run=True, out_root=out_root)
    assert folder == out_root / "tiny"
    text = page.read_text()
    table = text.split("```text\n")[1].split("\n```")[0]
    assert "stale numbers" not in text
    assert text.startswith("# Results\n\n" + marker)
    assert text.endswith("<!-- /ablation-table -->\n\nReading it.\n")
    assert table.splitlines()[0] == "tiny"
    assert "Δ eval loss vs abs" in table
    # the --set of the marker was applied: one training step
    assert "steps: 1\n" in (folder / "study.yaml").read_text()
    assert main([str(page), "--out-root", str(out_root), "--check"]) == 0  # up to date
    page.write_text(text.replace(table, table.replace("abs", "ABS", 1)))
    assert main([str(page), "--out-root", str(out_root), "--check"]) == 1  # edited by hand: stale
    assert main([str(page), "--out-root", str(out_root)]) == 0  # rewritten from the results, no run
    assert page.read_text() == text


def test_a_marker_naming_a_missing_study_is_reported_with_its_line(tmp_path):
    from bertblocks.ablation.doctables import DocTableError, update_page

    page = tmp_path / "page.md"
    page.write_text("intro\n\n<!-- ablation-table: nowhere.yaml -->\n```text\n```\n<!-- /ablation-table -->\n")
    with pytest.raises(DocTableError, match=r"page.md:3: study file not found: .*nowhere.yaml"):
        update_page(page, out_root=tmp_path)


def test_an_indented_marker_is_an_example_and_left_alone(tmp_path):
    from bertblocks.ablation.doctables import find_blocks

    text = "```markdown\n  <!-- ablation-table: nowhere.yaml -->\n  x\n  <!-- /ablation-table -->\n```\n"
    assert find_blocks(tmp_path / "page.md", text) == []


# ------------------------------------------------------------------------------------- old run records
def test_a_record_with_malformed_eval_samples_is_named_and_run_again(tmp_path, caplog):
    study = tiny_study(tmp_path)
    out = tmp_path / "out"
    run_study(study, out, workers=0, progress=False, echo=None)
    path = sorted((out / "runs").glob("abs-*seed0.json"))[0]
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "eval_samples": {"unit": "token", "loss": ["1.0", None]}}))
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        again = run_study(study, out, workers=0, progress=False, echo=None)
    assert f"run record {path} holds eval_samples that are not lists of numbers" in caplog.text
    assert again.executed == [path.stem]
    assert json.loads(path.read_text())["eval_samples"] == record["eval_samples"]


def test_a_record_without_eval_samples_is_read_and_summarised_over_seeds(tmp_path):
    # what a version before per-token losses wrote (reused here by keeping the fingerprint)
    study = tiny_study(tmp_path)
    out = tmp_path / "out"
    run_study(study, out, workers=0, progress=False, echo=None)
    for path in (out / "runs").glob("*.json"):
        record = json.loads(path.read_text())
        del record["eval_samples"]
        path.write_text(json.dumps(record))
    again = run_study(study, out, workers=0, progress=False, echo=None)
    assert again.executed == []
    assert {s.intervals["eval_loss"].sources for s in again.summaries} == {"seeds"}
    assert "records without per-sample eval values (an older version): intervals over seeds only" in again.table
    rel = next(s for s in again.summaries if s.variant == "rel")
    assert rel.differences["eval_loss"].sources == "seeds"  # paired by seed alone
