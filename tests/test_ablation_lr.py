"""A learning rate per variant: ``train.lr_grid`` picks each variant's and seed's rate on a validation split of
the training rows (never the eval set); a synthetic study shows a variant that wins only once its rate is
tuned, and a real one that the search runs, records and reports its choice."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from test_ablation import write_study

import bertblocks.ablation.training as training
from bertblocks.ablation import StudyError, load_study, run_study
from bertblocks.ablation.data import get_tokenizer, load_texts, prepare
from bertblocks.ablation.training import validation_split

VARIANTS = {
    "narrow": {"encoder.feedforward.intermediate_size": 37},
    "wide": {"encoder.feedforward.intermediate_size": 148},
}
#: (feed-forward width, learning rate) → the eval loss of a run: the wide variant needs a larger rate
LANDSCAPE = {(37, 1e-3): 3.0, (37, 1e-2): 3.4, (148, 1e-3): 3.2, (148, 1e-2): 2.6}


def lr_study(folder, **train: Any):
    settings = {"task": "mlm", "steps": 2, "batch_size": 4, "seq_len": 16, "seeds": [0, 1, 2], "lr": 1e-3}
    return write_study(
        folder,
        vary={},
        variants=VARIANTS,
        measure={"batch": 1, "seq_len": 8, "repeats": 1, "warmup": 0, "metrics": ["params"]},
        train={**settings, **train},
        corpus={"sentences": 150},
        tokenizer={"vocab_size": 150},
    )


@pytest.fixture
def synthetic_training(monkeypatch):
    """Training and evaluation replaced by the known LANDSCAPE (per-token losses around it, noise by seed),
    so that the study's selection, records and report are what is tested."""

    def train_model(model, data, spec, seed, **kwargs):
        width = model.config.encoder.feedforward.intermediate_size
        model.fake = (LANDSCAPE[(width, spec.lr)], seed)
        return {"train_loss": model.fake[0], "train_seconds": 1.0, "train_tokens": 64, "train_tokens_per_s": 64.0}

    def evaluate(model, data, spec):
        loss, seed = model.fake
        rng = random.Random(seed)
        tokens = [loss + rng.gauss(0, 0.2) for _ in range(200)]
        mean = sum(tokens) / len(tokens)
        return {"eval_loss": mean, "eval_rows": len(data.eval_ids), "eval_samples": {"unit": "token", "loss": tokens}}

    monkeypatch.setattr(training, "train_model", train_model)
    monkeypatch.setattr(training, "evaluate", evaluate)


def test_a_variant_that_wins_only_after_its_learning_rate_is_tuned(tmp_path, synthetic_training):
    shared = run_study(lr_study(tmp_path / "a"), tmp_path / "shared", workers=0, progress=False, echo=None)
    wide = shared.summaries[1]
    assert wide.differences["eval_loss"].estimate == pytest.approx(0.2, abs=0.05)  # at the baseline's rate: worse
    assert wide.differences["eval_loss"].distinguishable

    tuned = run_study(
        lr_study(tmp_path / "b", lr_grid=[1e-3, 1e-2]), tmp_path / "tuned", workers=0, progress=False, echo=None
    )
    narrow, wide = tuned.summaries
    assert narrow.lrs == [1e-3, 1e-3, 1e-3]  # one choice per seed
    assert wide.lrs == [1e-2, 1e-2, 1e-2]
    assert wide.differences["eval_loss"].estimate == pytest.approx(-0.4, abs=0.05)  # tuned: it wins
    assert wide.differences["eval_loss"].distinguishable
    lines = tuned.table.splitlines()
    assert lines[2].split()[:3] == ["variant", "seeds", "lr"]
    assert "0.01/0.01/0.01" in next(line for line in lines if line.startswith("wide "))
    assert "lr: the learning rate each seed chose" in tuned.table
    record = next(r for r in tuned.records if r["variant"] == "wide")
    assert record["metrics"]["lr"] == 1e-2
    assert record["metrics"]["lr_search"] == {"0.001": pytest.approx(3.2, abs=0.1), "0.01": pytest.approx(2.6, abs=0.1)}


def test_the_validation_split_is_apart_from_the_eval_set(tmp_path):
    study = load_study(lr_study(tmp_path))
    texts, labels = load_texts(study)
    data = prepare(study, get_tokenizer(study, texts), texts, labels)
    fit, held = validation_split(data)
    assert len(fit.train_ids) + len(held.eval_ids) == len(data.train_ids)
    assert torch.equal(torch.cat([fit.train_ids, held.eval_ids]), data.train_ids)
    assert len(held.eval_ids) == round(len(data.train_ids) * 0.1)
    assert torch.equal(fit.eval_ids, data.eval_ids)  # the reported eval set is not touched


def test_a_real_search_records_every_rate_it_tried(tmp_path):
    result = run_study(
        lr_study(tmp_path, seeds=[0], lr_grid=[1e-4, 3e-3]), tmp_path / "out", workers=0, progress=False, echo=None
    )
    for record in result.records:
        search = record["metrics"]["lr_search"]
        assert set(search) == {"0.0001", "0.003"}
        assert record["metrics"]["lr"] == min((1e-4, 3e-3), key=lambda lr: search[f"{lr:g}"])
    with pytest.raises(StudyError, match="listed twice"):
        load_study(lr_study(tmp_path, lr_grid=[1e-3, 1e-3]))


def test_fine_tuning_chooses_its_rate_on_held_out_training_examples(tmp_path):
    from test_ablation_downstream import write_study as downstream_study

    from bertblocks.ablation.downstream import _validation_split, prepare_downstream

    task = {"source": "embedded:number", "steps": 3, "train_examples": 40, "eval_examples": 24, "batch_size": 8}
    path = downstream_study(
        tmp_path,
        vary={"position.name": ["absolute"]},
        train={"task": "mlm", "steps": 2, "batch_size": 8, "seq_len": 32, "seeds": [0, 1], "eval_batches": 1},
        downstream=[{**task, "lr_grid": [1e-5, 3e-3]}],
        from_scratch=False,
    )
    result = run_study(path, tmp_path / "out", workers=0, progress=False, echo=None)
    for record in result.downstream_records:
        assert set(record["lr_search"]) == {"1e-05", "0.003"}
        best = max(record["lr_search"].values())
        assert record["lr_search"][f"{record['lr']:g}"] == best  # the best validation accuracy (first of a tie)
    entry = result.summaries[0].downstream["number/accuracy"]
    assert entry.lrs == [r["lr"] for r in sorted(result.downstream_records, key=lambda r: r["seed"])]
    assert "number: fine-tuning rate each seed chose (in seed order) on a validation split" in result.table

    study = load_study(path)
    texts, _ = load_texts(study)
    (data,) = prepare_downstream(study, get_tokenizer(study, texts))
    fit, held = _validation_split(data)
    assert torch.equal(torch.cat([fit.train_ids, held.eval_ids]), data.train_ids)
    assert len(held.eval_ids) == 4  # a tenth of the 40 training examples
    assert torch.equal(fit.eval_ids, data.eval_ids)  # the reported eval examples are not touched
    with pytest.raises(StudyError, match="distinct positive rates"):
        load_study(downstream_study(tmp_path, downstream=[{**task, "lr_grid": [1e-3, 1e-3]}]))
