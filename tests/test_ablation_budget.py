"""Compute-matched training budgets: a FLOP- or token-matched study stops every variant at the same compute
(within one step), the default budget is what the baseline spends in ``steps`` steps, and the report says which
budget ruled."""

from __future__ import annotations

import pytest
from test_ablation import write_study

from bertblocks.ablation import StudyError, load_study, run_study
from bertblocks.ablation.training import resolved_train, train_flops_per_token

# two variants whose steps cost different FLOPs: a feed-forward 37 wide against one 148 wide
VARIANTS = {
    "narrow": {"encoder.feedforward.intermediate_size": 37},
    "wide": {"encoder.feedforward.intermediate_size": 148},
}


def budget_study(folder, **train):
    settings = {"task": "mlm", "steps": 6, "batch_size": 4, "seq_len": 16, "seeds": [0], "eval_batches": 1}
    return write_study(
        folder,
        vary={},
        variants=VARIANTS,
        measure={"batch": 1, "seq_len": 8, "repeats": 1, "warmup": 0, "metrics": ["params", "flops"]},
        train={**settings, **train},
        corpus={"sentences": 150},
        tokenizer={"vocab_size": 150},
    )


def test_a_flop_matched_study_stops_every_variant_at_the_same_flops_within_one_step(tmp_path):
    result = run_study(budget_study(tmp_path, budget="flops"), tmp_path / "out", workers=0, progress=False, echo=None)
    by_name = {r["variant"]: r["metrics"] for r in result.records}
    narrow, wide = by_name["narrow"], by_name["wide"]
    study = result.study
    per_token = {v.name: train_flops_per_token(v.config, 16) for v in study.variants}
    assert per_token["wide"] > 1.5 * per_token["narrow"]
    # the default budget: the baseline's (the first variant's) FLOPs in `steps` full batches
    budget = 6 * 4 * 16 * per_token["narrow"]
    step = {name: 4 * 16 * per_token[name] for name in per_token}  # a step's FLOPs (mlm rows are all real)
    for name, metrics in by_name.items():
        assert metrics["budget"] == "flops"
        assert metrics["budget_value"] == pytest.approx(budget)
        assert metrics["budget_reached"] is True
        assert budget <= metrics["train_flops"] < budget + step[name], name  # stopped within one step
    assert abs(narrow["train_flops"] - wide["train_flops"]) <= max(step.values())
    assert narrow["train_steps"] == 6  # the baseline takes its `steps`
    assert wide["train_steps"] < narrow["train_steps"]  # the dearer variant fewer
    assert "budget: flops (every run trained until it had spent" in result.table
    assert " steps " in result.table.splitlines()[2]  # the steps column


def test_a_token_budget_counts_real_tokens_and_a_steps_budget_is_said(tmp_path):
    study = load_study(budget_study(tmp_path, budget="tokens", budget_value=200))
    assert resolved_train(study)["budget_value"] == 200
    default = load_study(budget_study(tmp_path, budget="tokens"))
    assert resolved_train(default)["budget_value"] == 6 * 4 * 16
    result = run_study(
        budget_study(tmp_path, budget="tokens", budget_value=200), tmp_path / "t", workers=0, progress=False, echo=None
    )
    for record in result.records:
        assert 200 <= record["metrics"]["train_tokens"] < 200 + 4 * 16
        assert record["metrics"]["train_steps"] == 4  # 64 tokens a step: the fourth reaches 200
    steps = run_study(budget_study(tmp_path, steps=2), tmp_path / "s", workers=0, progress=False, echo=None)
    assert "budget: steps (every run took the same optimizer steps" in steps.table


def test_budget_settings_are_checked(tmp_path):
    with pytest.raises(StudyError, match="budget: seconds needs budget_value"):
        load_study(budget_study(tmp_path, budget="seconds"))
    with pytest.raises(StudyError, match="budget_value is read with budget: tokens, flops or seconds"):
        load_study(budget_study(tmp_path, budget_value=10))
    with pytest.raises(StudyError, match=r"train\.budget"):
        load_study(budget_study(tmp_path, budget="joules"))


def test_the_progress_bar_weighs_runs_by_their_estimated_flops(tmp_path, capsys, monkeypatch):
    from bertblocks.ablation.downstream import DownstreamRunTask
    from bertblocks.ablation.flops import analytic_flops_per_token
    from bertblocks.ablation.runner import _progress, _tasks, estimated_work

    study = load_study(budget_study(tmp_path, lr_grid=[1e-3, 1e-2]))
    narrow, wide = _tasks(study, None, None)
    config = study.variants[0].config
    forward = {
        n: analytic_flops_per_token(v.config, 16).per_token for n, v in zip(VARIANTS, study.variants, strict=True)
    }
    measure = analytic_flops_per_token(config, 8).per_token * 1 * 8 * 1
    # two rates of 6 steps of 4 × 16 tokens, at 3 × the forward FLOPs
    assert estimated_work(narrow) == pytest.approx(measure + 2 * 3 * forward["narrow"] * 6 * 4 * 16)
    assert estimated_work(wide) > 1.5 * estimated_work(narrow)
    spec = {"steps": 3, "batch_size": 2, "seq_len": 16}
    fine = DownstreamRunTask("narrow", 0, narrow.config, spec, None, None, 1, "f", "r", "p")
    assert estimated_work(fine) == pytest.approx(3 * forward["narrow"] * 3 * 2 * 16)
    assert estimated_work(fine) < estimated_work(narrow) / 5  # 6 batches of 2 against 2 × 6 of 4: not a run

    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tqdm" else real(name, *a))
    bar = _progress(3, 0, 100.0, 0.0, "t", True)  # the plain line (without tqdm): runs and the share of work
    bar.update(1, 80.0)
    assert "t: 1/3 runs (80% of the estimated work)" in capsys.readouterr().err


def test_a_seconds_budget_stops_at_the_first_step_past_it(tmp_path):
    from bertblocks.ablation.data import get_tokenizer, load_texts, prepare
    from bertblocks.ablation.study import TrainSpec, expand_variants
    from bertblocks.ablation.training import task_model, train_model

    study = load_study(budget_study(tmp_path))
    texts, labels = load_texts(study)
    data = prepare(study, get_tokenizer(study, texts), texts, labels)
    (variant, _) = expand_variants(study, {"vocab_size": data.vocab_size, "pad_token_id": data.pad_id})
    spec = TrainSpec.model_validate({**study.spec.train.model_dump(), "budget": "seconds", "budget_value": 1e-9})
    result = train_model(task_model("mlm", variant.config), data, spec, 0)
    assert result["train_steps"] == 1  # any step outlasts a nanosecond: one step, then the budget is spent
    assert result["budget_reached"] is True
    assert result["budget"] == "seconds"
    with pytest.raises(ValueError, match="budget: flops needs the variant's flops_per_token"):
        train_model(task_model("mlm", variant.config), data, spec.model_copy(update={"budget": "flops"}), 0)
