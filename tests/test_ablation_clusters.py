"""Cluster-robust intervals for the masked-LM eval loss: the eval tokens of one sentence share its difficulty,
so the interval counts sentences, not tokens. Checked for coverage on synthetic clustered studies of known
mean (the token interval is not), and on a real evaluation, whose records keep each token's sentence."""

from __future__ import annotations

import math
import random

import pytest
from test_ablation import write_study

from bertblocks.ablation import load_study
from bertblocks.ablation.data import get_tokenizer, load_texts, prepare
from bertblocks.ablation.stats import cluster_rows, interval, paired_difference
from bertblocks.ablation.study import expand_variants
from bertblocks.ablation.training import eval_sentences, evaluate, task_model

TRUE_MEAN = 3.0


def clustered_study(rng: random.Random, seeds: int, sentences: int, sentence_sd: float, noise_sd: float):
    """A seeds × tokens matrix whose tokens come in sentences of 2 to 12 tokens: each sentence has its own
    difficulty (shared by its tokens and by every seed), each seed a small offset, each value noise."""
    sizes = [rng.randint(2, 12) for _ in range(sentences)]
    clusters = [c for c, n in enumerate(sizes) for _ in range(n)]
    effect = [rng.gauss(0, sentence_sd) for _ in range(sentences)]
    offsets = [rng.gauss(0, 0.02) for _ in range(seeds)]
    # the true mean is the expected per-token mean: sentence effects are centred, so it is TRUE_MEAN
    rows = [[TRUE_MEAN + offsets[s] + effect[c] + rng.gauss(0, noise_sd) for c in clusters] for s in range(seeds)]
    return rows, clusters


def coverage(trials: int, *, by_sentence: bool, seeds: int = 3) -> float:
    rng = random.Random(1)
    hits = 0
    for _ in range(trials):
        rows, clusters = clustered_study(rng, seeds=seeds, sentences=80, sentence_sd=1.0, noise_sd=0.5)
        per_seed = [sum(r) / len(r) for r in rows]
        iv = interval(rows, per_seed, clusters=clusters if by_sentence else None)
        hits += iv.low <= TRUE_MEAN <= iv.high
    return hits / trials


@pytest.mark.parametrize("seeds", [1, 3])
def test_the_sentence_interval_covers_95_percent_where_the_token_interval_does_not(seeds):
    trials = 1000
    margin = 3 * math.sqrt(0.95 * 0.05 / trials)  # three binomial standard errors: ±0.021
    by_sentence = coverage(trials, by_sentence=True, seeds=seeds)
    assert abs(by_sentence - 0.95) <= margin, by_sentence
    by_token = coverage(trials, by_sentence=False, seeds=seeds)
    assert by_token < 0.95 - margin, by_token  # treating ~280 tokens as independent: far too narrow


def test_cluster_rows_keep_each_seed_s_mean_and_count_sentences():
    rng = random.Random(1)
    rows, clusters = clustered_study(rng, seeds=2, sentences=7, sentence_sd=1.0, noise_sd=0.5)
    pseudo = cluster_rows(rows, clusters)
    assert [len(r) for r in pseudo] == [7, 7]
    for row, new in zip(rows, pseudo, strict=True):
        assert sum(new) / len(new) == pytest.approx(sum(row) / len(row), abs=1e-12)
    iv = interval(rows, [sum(r) / len(r) for r in rows], clusters=clusters)
    assert iv.samples == 7  # it rests on 7 sentences, not on the tokens
    with pytest.raises(ValueError, match="one sentence id per value"):
        cluster_rows(rows, clusters[:-1])


def test_a_paired_difference_resamples_sentences_too():
    rng = random.Random(2)
    base, clusters = clustered_study(rng, seeds=3, sentences=30, sentence_sd=1.0, noise_sd=0.5)
    # the variant is worse on some sentences, better on others: a sentence-level interaction
    twist = [rng.gauss(0, 0.3) for _ in range(30)]
    other = [[v + twist[c] + rng.gauss(0, 0.1) for v, c in zip(row, clusters, strict=True)] for row in base]
    means = [{s: sum(r) / len(r) for s, r in enumerate(m)} for m in (other, base)]
    tokens = paired_difference(dict(enumerate(other)), dict(enumerate(base)), *means)
    sentences = paired_difference(dict(enumerate(other)), dict(enumerate(base)), *means, clusters=clusters)
    assert sentences.estimate == pytest.approx(tokens.estimate, abs=1e-12)
    assert sentences.half_width > 1.5 * tokens.half_width


def test_a_real_evaluation_keeps_the_sentence_of_every_eval_token(tmp_path):
    study = load_study(
        write_study(
            tmp_path,
            vary={"position.name": ["absolute"]},
            train={"task": "mlm", "steps": 1, "batch_size": 4, "seq_len": 16, "seeds": [0]},
            corpus={"sentences": 120},
            tokenizer={"vocab_size": 200},
        )
    )
    texts, labels = load_texts(study)
    data = prepare(study, get_tokenizer(study, texts), texts, labels)
    spec = study.spec.train
    (variant,) = expand_variants(study, {"vocab_size": data.vocab_size, "pad_token_id": data.pad_id})
    result = evaluate(task_model("mlm", variant.config), data, spec)
    sentence = result["eval_samples"]["sentence"]
    assert len(sentence) == len(result["eval_samples"]["loss"])
    assert sentence == sorted(sentence)  # in stream order
    assert sentence == eval_sentences(data, spec)  # the same mechanism, without a model
    # each id is the number of [SEP] before the token in the packed eval stream
    stream = data.eval_ids[:, 1:].reshape(-1).tolist()
    assert max(sentence) <= stream.count(data.sep_id)
    assert len(set(sentence)) > 5
