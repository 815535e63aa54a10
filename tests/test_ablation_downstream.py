"""Downstream evaluation in ablation studies: an embedded task end to end (killed and resumed), reuse of
pre-training and fine-tuning on resume, the metrics against reference implementations, the bootstrap
intervals against the analytic ones, the embedded tasks, local files, and bad `downstream:` sections."""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY

from bertblocks.ablation import StudyError, load_study, run_study
from bertblocks.ablation.corpus import _PLURAL, _SINGULAR, generate_sentences
from bertblocks.ablation.data import train_tokenizer
from bertblocks.ablation.doctables import table_from_results
from bertblocks.ablation.downstream import _encode, bootstrap_interval, metric_batch
from bertblocks.ablation.stats import interval, paired_difference
from bertblocks.ablation.tasks import Example, embedded_examples
from tests.test_ablation import ablate_and_kill

VARIANTS = ["position=absolute", "position=relative_key"]
SEEDS = [0, 1]
TASKS = [
    {"source": "embedded:number", "steps": 3, "train_examples": 64, "eval_examples": 48, "batch_size": 8},
    {"source": "embedded:similarity", "steps": 3, "train_examples": 64, "eval_examples": 40, "batch_size": 8},
]


def write_study(folder: Path, **changes: object) -> Path:
    """A tiny study: hidden 32, 2 layers, 2 position schemes x 2 seeds, a few MLM steps, two embedded tasks."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    study = {
        "name": "tiny-downstream",
        "base": "tiny.yaml",
        "vary": {"position.name": ["absolute", "relative_key"]},
        "measure": {"batch": 2, "seq_len": 16, "repeats": 1, "warmup": 0, "metrics": ["params"]},
        "train": {"task": "mlm", "steps": 3, "batch_size": 8, "seq_len": 32, "seeds": SEEDS, "eval_batches": 1},
        "corpus": {"sentences": 300},
        "tokenizer": {"vocab_size": 200},
        "downstream": TASKS,
        **changes,
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}


# ------------------------------------------------------------------------------ end to end, kill, resume
@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory):
    """Start `bertblocks ablate` in a subprocess, SIGKILL it once the first fine-tuning is on disk, resume."""
    folder = tmp_path_factory.mktemp("study")
    study = write_study(folder)
    out = folder / "out"
    finished = out / "downstream"
    ablate_and_kill(study, out, finished, seconds=300)
    before = {"runs": mtimes(out / "runs"), "downstream": mtimes(finished)}
    result = run_study(study, out, workers=0, progress=False, echo=None)
    return result, before, out


def test_killed_study_resumes_without_redoing_pretraining_or_finished_fine_tunings(killed_then_resumed):
    result, before, out = killed_then_resumed
    runs = len(VARIANTS) * len(SEEDS)
    fine_tunings = (runs + len(SEEDS)) * len(TASKS)  # the from-scratch control's included
    assert len(before["runs"]) == runs, "the fine-tunings start once every pre-training run is on disk"
    assert 1 <= len(before["downstream"]) < fine_tunings, "the kill should come between two fine-tunings"
    assert result.executed == []  # no pre-training redone: the weights were on disk
    assert sorted(result.reused) == sorted(n.removesuffix(".json") for n in before["runs"])
    assert sorted(result.downstream_reused) == sorted(n.removesuffix(".json") for n in before["downstream"])
    assert len(result.downstream_executed) == fine_tunings - len(before["downstream"])
    assert mtimes(out / "downstream") | before["downstream"] == mtimes(out / "downstream")  # not rewritten
    assert mtimes(out / "runs") == before["runs"]
    assert not list((out / "downstream").glob(".*.tmp"))
    assert not list((out / "weights").glob(".*.tmp"))

    again = run_study(out / "study.yaml", out, workers=0, progress=False, echo=None)
    assert again.executed == []
    assert again.downstream_executed == []
    assert len(again.downstream_reused) == fine_tunings


def test_downstream_metrics_have_intervals_and_paired_differences_in_table_csv_and_json(killed_then_resumed):
    result, _, out = killed_then_resumed
    keys = ["number/accuracy", "number/f1", "similarity/spearman"]
    base, other = result.summaries
    for summary in result.summaries:
        assert list(summary.downstream) == keys
        for key in keys:
            entry = summary.downstream[key]
            assert entry.seeds == SEEDS
            per_seed = [
                r["metrics"][key.split("/")[1]]
                for r in result.downstream_records
                if r["variant"] == summary.variant and r["task"] == key.split("/")[0]
            ]
            assert entry.mean == pytest.approx(statistics.fmean(per_seed))
            assert entry.interval.seeds == 2
            assert entry.interval.sources == "seeds+samples"
    assert all(e.difference is None for e in base.downstream.values())
    assert all(e.difference is not None and e.difference.seeds == 2 for e in other.downstream.values())
    # the paired difference's estimate is the mean of the per-seed differences
    acc = {
        (r["variant"], r["seed"]): r["metrics"]["accuracy"] for r in result.downstream_records if r["task"] == "number"
    }
    expected = statistics.fmean(acc[(VARIANTS[1], s)] - acc[(VARIANTS[0], s)] for s in SEEDS)
    assert other.downstream["number/accuracy"].difference.estimate == pytest.approx(expected)

    assert "downstream: each run fine-tuned" in result.table
    assert "number acc" in result.table
    assert "similarity ρ" in result.table
    assert "(baseline)" in result.table
    assert f"Δ vs {VARIANTS[0]}" in result.table

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert float(rows[1]["similarity/spearman"]) == pytest.approx(other.downstream["similarity/spearman"].mean)
    assert rows[0]["number/accuracy_delta"] == ""
    assert rows[1]["number/f1_delta_distinguishable"] in ("True", "False", "")

    assert table_from_results(out / "results.json") == result.table  # the docs' tables, rebuilt from the JSON

    data = json.loads((out / "results.json").read_text())
    entry = data["variants"][1]["downstream"]["number/f1"]
    assert entry["difference"]["distinguishable"] in (True, False)
    assert len(data["variants"][1]["downstream_runs"]) == len(SEEDS) * len(TASKS)
    record = data["variants"][0]["downstream_runs"][0]
    assert len(record["predictions"]["pred"]) == len(record["predictions"]["gold"])
    assert record["shared_weights"] > 0  # the pre-trained backbone was loaded


def test_control_rows_show_majority_chance_and_the_from_scratch_arm(killed_then_resumed):
    result, _, out = killed_then_resumed
    names = [c.name for c in result.controls]
    assert names == ["majority / mean", "chance", f"from scratch ({VARIANTS[0]})"]
    data = json.loads((out / "results.json").read_text())
    scratch = data["control_runs"]
    assert len(scratch) == len(SEEDS) * len(TASKS)
    assert all(r["variant"] == "from-scratch" and r["shared_weights"] == 0 for r in scratch)  # random weights
    row = result.controls[2].entries["number/accuracy"]
    per_seed = [r["metrics"]["accuracy"] for r in scratch if r["task"] == "number"]
    assert row.mean == pytest.approx(statistics.fmean(per_seed))
    assert row.seeds == SEEDS
    # the majority row predicts the training labels' majority class for every eval example
    number = next(r for r in result.downstream_records if r["task"] == "number")
    gold = number["predictions"]["gold"]
    expected = sum(g == number["constant"] for g in gold) / len(gold)
    assert result.controls[0].entries["number/accuracy"].mean == pytest.approx(expected)
    assert result.controls[0].entries["similarity/spearman"].mean == 0  # a constant score ranks nothing
    for name in names:
        assert any(line.startswith(name) for line in result.table.splitlines()), name
    assert [c["name"] for c in data["controls"]] == names
    assert table_from_results(out / "results.json") == result.table  # rebuilt with the same control rows


def test_the_study_pareto_plot_has_a_row_per_downstream_task(killed_then_resumed):
    _, _, out = killed_then_resumed
    image = (out / "results-pareto.png").read_bytes()
    assert image[:8] == b"\x89PNG\r\n\x1a\n"
    # 3.8 inches a row at 110 dpi: eval loss, then number/accuracy and similarity/spearman (matplotlib versions
    # round the figure's size in pixels differently: within a pixel)
    assert abs(int.from_bytes(image[20:24], "big") - 3 * round(3.8 * 110)) <= 1


def test_missing_weights_redo_only_that_pretraining_and_give_the_same_numbers(tmp_path, killed_then_resumed):
    _, _, out = killed_then_resumed
    copy = tmp_path / "out"
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    study = yaml.safe_load((copy / "study.yaml").read_text())
    victim = sorted(p for p in (copy / "downstream").glob("*.json") if not p.name.startswith("from-scratch"))[0]
    old = json.loads(victim.read_text())
    run_id = old["pretrain_run"]
    for path in (copy / "weights").glob(f"{run_id}__*.pt"):
        path.unlink()
    victim.unlink()
    result = run_study(study, copy, workers=0, progress=False, echo=None)
    assert result.executed == [run_id]  # its weights were needed again, and only its
    assert result.downstream_executed == [victim.stem]
    new = json.loads(victim.read_text())
    assert new["metrics"] == old["metrics"]
    assert new["predictions"] == old["predictions"]

    # a changed fine-tuning setting redoes the fine-tunings of that task only, from the saved weights
    study["downstream"][1]["steps"] = 4
    changed = run_study(study, copy, workers=0, progress=False, echo=None)
    assert changed.executed == []
    assert sorted(changed.downstream_executed) == sorted(
        r for r in changed.downstream_reused + changed.downstream_executed if "similarity" in r
    )
    assert len(changed.downstream_reused) == (len(VARIANTS) + 1) * len(SEEDS)  # + the from-scratch control


def test_fine_tunings_on_ray_match_those_of_a_local_worker(tmp_path, killed_then_resumed):
    """The killed study's fine-tunings (a local worker process, then this process) done again as Ray tasks,
    from the same saved weights: the same predictions."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    local, _, out = killed_then_resumed
    copy = tmp_path / "out"
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    for record in (copy / "downstream").glob("*.json"):
        record.unlink()
    ray.init(num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False, log_to_driver=False)
    try:
        result = run_study(copy / "study.yaml", copy, executor="ray", progress=False, echo=None)
    finally:
        ray.shutdown()
    assert result.executed == []
    assert len(result.downstream_executed) == (len(VARIANTS) + 1) * len(SEEDS) * len(TASKS)
    expected = {r["run_id"]: r for r in local.downstream_records}
    assert len(result.downstream_records) == len(local.downstream_records)
    for record in result.downstream_records:
        assert record["predictions"] == expected[record["run_id"]]["predictions"], record["run_id"]
        assert record["metrics"]["train_loss"] == expected[record["run_id"]]["metrics"]["train_loss"]


# ------------------------------------------------------------------------------------------- metrics
def test_macro_f1_spearman_and_pearson_match_reference_implementations():
    sklearn = pytest.importorskip("sklearn.metrics")
    scipy_stats = pytest.importorskip("scipy.stats")
    gen = torch.Generator().manual_seed(0)
    gold = torch.randint(0, 3, (2, 50), generator=gen)
    pred = torch.randint(0, 4, (2, 50), generator=gen)  # a class (3) the gold labels lack
    f1 = metric_batch("f1", pred, gold)
    for row in range(2):
        assert float(f1[row]) == pytest.approx(sklearn.f1_score(gold[row], pred[row], average="macro"), abs=1e-12)
    scores = torch.randint(0, 6, (2, 40), generator=gen).double()  # ties, as in STS scores
    guesses = scores + torch.randn(2, 40, generator=gen).double()
    guesses[1, :10] = 2.0  # tied predictions too
    rho = metric_batch("spearman", guesses, scores)
    r = metric_batch("pearson", guesses, scores)
    for row in range(2):
        assert float(rho[row]) == pytest.approx(scipy_stats.spearmanr(guesses[row], scores[row])[0], abs=1e-12)
        assert float(r[row]) == pytest.approx(scipy_stats.pearsonr(guesses[row], scores[row])[0], abs=1e-12)
    assert float(metric_batch("spearman", torch.full((1, 5), 2.0), scores[:1, :5])[0]) == 0.0  # constant: 0


def test_bootstrap_interval_agrees_with_the_analytic_one_for_accuracy():
    """For a mean of per-example values the analytic interval is exact; the bootstrap must come close, with
    one seed (examples only) and with several (seeds and examples, the interaction taken out)."""
    gen = torch.Generator().manual_seed(1)
    gold = torch.randint(0, 2, (600,), generator=gen).tolist()
    shared = torch.rand(600, generator=gen) < 0.75  # the examples' difficulty, common to the seeds
    preds, correct, values = {}, {}, {}
    for seed in range(4):
        right = shared ^ (torch.rand(600, generator=gen) < 0.1 + 0.03 * seed)
        preds[seed] = [g if ok else 1 - g for g, ok in zip(gold, right.tolist(), strict=True)]
        correct[seed] = [float(ok) for ok in right.tolist()]
        values[seed] = statistics.fmean(correct[seed])
    for seeds in ([0], [0, 1, 2, 3]):
        boot = bootstrap_interval("accuracy", gold, {s: preds[s] for s in seeds}, resamples=4000)
        exact = interval([correct[s] for s in seeds], [values[s] for s in seeds])
        assert boot.estimate == pytest.approx(exact.estimate, abs=1e-12)
        assert boot.sources == exact.sources
        assert boot.half_width == pytest.approx(exact.half_width, rel=0.12)
    base = dict.fromkeys(range(4), preds[0])
    diff = bootstrap_interval("accuracy", gold, preds, base, resamples=4000)
    exact = paired_difference(correct, dict.fromkeys(range(4), correct[0]), values, dict.fromkeys(range(4), values[0]))
    assert diff.estimate == pytest.approx(exact.estimate, abs=1e-12)
    assert diff.half_width == pytest.approx(exact.half_width, rel=0.12)
    same = bootstrap_interval("f1", gold, preds, preds)
    assert same.estimate == 0
    assert same.half_width == 0


# ------------------------------------------------------------------------------------- embedded tasks
def test_embedded_tasks_are_deterministic_and_speak_the_corpus_vocabulary():
    corpus = {word for sentence in generate_sentences(6000, seed=0) for word in sentence.split()}
    for name, labels in (("number", {0, 1}), ("agreement", {0, 1}), ("paraphrase", {0, 1})):
        examples = embedded_examples(name, "train", 300)
        assert examples == embedded_examples(name, "train", 300)
        assert examples != embedded_examples(name, "eval", 300)
        assert {e.label for e in examples} == labels
        words = {w for e in examples for text in (e.text, e.pair) if text for w in text.split()}
        assert words <= corpus, words - corpus
    scores = {e.label for e in embedded_examples("similarity", "train", 300)}
    assert scores == {0.0, 1.0, 2.0, 3.0, 4.0, 5.0}
    for e in embedded_examples("agreement", "eval", 200):  # label 1 exactly when the verb agrees
        words = e.text.split()
        plural = next(w for w in words if w in _PLURAL["noun"] or w in _SINGULAR["noun"]) in _PLURAL["noun"]
        verbs = [w for w in words if any(w in v[k] for v in (_SINGULAR, _PLURAL) for k in ("verb", "verb_i", "be"))]
        assert (
            verbs[0] in {v for k in ("verb", "verb_i", "be") for v in (_PLURAL if plural else _SINGULAR)[k]}
        ) == bool(e.label)
    for e in embedded_examples("number", "eval", 200):
        subject = next(w for w in e.text.split() if w in _PLURAL["noun"] or w in _SINGULAR["noun"])
        assert (subject in _PLURAL["noun"]) == bool(e.label)


def test_pairs_are_encoded_with_token_types_and_cut_longest_first():
    tokenizer = train_tokenizer(["a b c d e f g h"], 100)
    pad, cls, sep = (tokenizer.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]"))
    ids, mask, types = _encode(tokenizer, [Example("a b c d e f", "g h", 1), Example("a", "b", 0)], 9, pad, cls, sep)
    a, b, g, h = (tokenizer.token_to_id(t) for t in "abgh")
    assert ids[0].tolist() == [cls, a, b, tokenizer.token_to_id("c"), tokenizer.token_to_id("d"), sep, g, h, sep]
    assert types[0].tolist() == [0] * 6 + [1] * 3
    assert ids[1].tolist() == [cls, a, sep, b, sep, pad, pad, pad, pad]
    assert mask[1].tolist() == [1] * 5 + [0] * 4
    assert types[1].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0]


def test_local_jsonl_and_csv_tasks_with_named_labels(tmp_path):
    rows = [{"s1": f"the cat sees the dog {i % 3}", "s2": "a dog sleeps", "y": ["no", "yes"][i % 2]} for i in range(30)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with (tmp_path / "single.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows([[f"the cats run {i}", i % 3] for i in range(30)])
    study = write_study(
        tmp_path,
        downstream=[
            {
                "name": "pairs",
                "kind": "pair-classification",
                "source": "pairs.jsonl",
                "steps": 2,
                "columns": {"text": "s1", "text_pair": "s2", "label": "y"},
                "metrics": ["accuracy"],
            },
            {
                "name": "single",
                "kind": "classification",
                "source": "single.csv",
                "steps": 2,
                "columns": {"text": "text"},
                "eval_fraction": 0.5,
            },
        ],
        train={"task": "mlm", "steps": 2, "batch_size": 8, "seq_len": 32, "seeds": [0]},
        vary={"position.name": ["absolute"]},
    )
    result = run_study(study, tmp_path / "out", workers=0, progress=False, echo=None)
    summary = result.summaries[0]
    assert list(summary.downstream) == ["pairs/accuracy", "single/accuracy", "single/f1"]
    assert summary.downstream["pairs/accuracy"].examples == 6  # 20% of 30 held out
    assert summary.downstream["single/f1"].examples == 15
    assert summary.downstream["single/accuracy"].interval.sources == "samples"  # one seed
    records = {r["task"]: r for r in result.downstream_records}
    assert set(records["pairs"]["predictions"]["gold"]) <= {0, 1}  # names in sorted order: no → 0, yes → 1
    assert set(records["single"]["predictions"]["gold"]) <= {0, 1, 2}


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("task", "where", "text"),
    [
        ({"source": "embedded:agrement"}, "downstream.0", "did you mean 'agreement'"),
        ({"source": "data.jsonl"}, "downstream.0", "kind: required"),
        ({"source": "data.txt", "kind": "classification"}, "downstream.0", "neither embedded:NAME"),
        ({"source": "embedded:number", "metrics": ["spearman"]}, "downstream.0", "spearman cannot be computed"),
        ({"source": "embedded:similarity", "kind": "classification"}, "downstream.0", "is similarity-regression"),
        ({"source": "embedded:number", "steps": 0}, "downstream.0.steps", "greater than 0"),
        ({"source": "embedded:number", "colums": {}}, "downstream.0.colums", ""),
        ({"source": "hf:"}, "downstream.0", "needs a dataset name"),
    ],
)
def test_bad_downstream_task_is_located(tmp_path, task, where, text):
    with pytest.raises(StudyError) as info:
        load_study(write_study(tmp_path, downstream=[task]))
    message = str(info.value)
    assert where in message, message
    assert text in message, message


def test_downstream_needs_masked_lm_pretraining_and_distinct_names(tmp_path):
    with pytest.raises(StudyError, match=r"downstream: fine-tunes the weights of masked-LM pre-training"):
        load_study(write_study(tmp_path, train=None))
    with pytest.raises(StudyError, match=r"downstream: .*task: mlm"):
        load_study(write_study(tmp_path, train={"task": "classification"}))
    twice = [{"source": "embedded:number"}, {"source": "embedded:number", "steps": 5}]
    with pytest.raises(StudyError, match=r"downstream.1.name: 'number' names two tasks"):
        load_study(write_study(tmp_path, downstream=twice))


def test_missing_or_malformed_task_file_is_reported_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    study = write_study(tmp_path, downstream=[{"source": "nope.csv", "kind": "classification"}])
    with pytest.raises(StudyError, match=r"downstream.0.source: file not found: .*nope.csv"):
        run_study(study, out, workers=0, progress=False, echo=None)
    (tmp_path / "bad.jsonl").write_text('{"sentence": "the cat runs .", "label": 1}\n{"sentence": "a dog"}\n')
    study = write_study(tmp_path, downstream=[{"source": "bad.jsonl", "kind": "classification"}])
    with pytest.raises(StudyError, match=r"bad.jsonl, line 2: no value for column\(s\) label"):
        run_study(study, out, workers=0, progress=False, echo=None)
    study = write_study(tmp_path, downstream=[{"source": "embedded:number", "seq_len": 100}])
    with pytest.raises(StudyError, match=r"downstream.0.seq_len: 100 tokens exceed max_position_embeddings=64"):
        run_study(study, out, workers=0, progress=False, echo=None)
    assert not out.exists()


def test_hf_source_without_datasets_or_network_is_a_clear_error(tmp_path, monkeypatch):
    import bertblocks.ablation.tasks as tasks

    study = write_study(tmp_path, downstream=[{"source": "hf:glue/sst2", "kind": "classification"}])
    real = tasks.importlib.util.find_spec
    monkeypatch.setattr(tasks.importlib.util, "find_spec", lambda name: None if name == "datasets" else real(name))
    with pytest.raises(StudyError, match=r"downstream.0.source: hf:glue/sst2 needs the `datasets` library"):
        run_study(study, tmp_path / "out", workers=0, progress=False, echo=None)
    monkeypatch.undo()
    if real("datasets") is None:
        return
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # no network here: loading must fail with a clear message
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(StudyError, match=r"hf:glue/sst2 split 'train' could not be loaded .* local .csv/.tsv/.jsonl"):
        run_study(study, tmp_path / "out", workers=0, progress=False, echo=None)
    assert not (tmp_path / "out").exists()


def test_interval_of_one_seed_and_nan_free_summary_of_a_diverged_fine_tuning():
    from bertblocks.ablation.downstream import attach
    from bertblocks.ablation.report import VariantSummary

    gold = [0, 1, 0, 1, 1, 0]
    record = {
        "variant": "a",
        "seed": 0,
        "task": "t",
        "status": "ok",
        "metrics": {
            "accuracy": 4 / 6,
            "f1": float(metric_batch("f1", torch.tensor([[0, 1, 1, 1, 0, 1]]), torch.tensor([gold]))[0]),
        },
        "predictions": {"pred": [0, 1, 1, 1, 0, 1], "gold": gold},
    }
    diverged = {"variant": "b", "seed": 0, "task": "t", "status": "diverged", "metrics": {"diverged_at_step": 2}}
    summaries = [VariantSummary("a", {}, [0]), VariantSummary("b", {}, [0], baseline="a")]
    attach(summaries, [record, diverged], [("t", ["accuracy", "f1"])], "a")
    assert summaries[0].downstream["t/accuracy"].interval.sources == "samples"
    assert math.isfinite(summaries[0].downstream["t/f1"].interval.half_width)
    assert summaries[1].downstream["t/accuracy"].diverged == [0]
    assert not summaries[1].downstream["t/accuracy"].seeds


def test_modern_encoder_example_fine_tunes_on_the_embedded_number_task():
    study = load_study(Path(__file__).parents[1] / "examples" / "studies" / "modern-encoder.yaml")
    (task,) = study.spec.downstream
    assert (task.source, task.kind, task.title, task.reported) == (
        "embedded:number",
        "classification",
        "number",
        ["accuracy", "f1"],
    )


# ------------------------------------------------------------------------------ the how-to's kept results
HOW_TO = Path(__file__).parents[1] / "docs" / "how-to" / "ablation-studies.md"
KEPT = HOW_TO.parent / "ablation-results"


def test_how_to_tables_are_the_tables_of_the_results_the_repo_keeps():
    """Every table of the how-to is the table of its study's results.json, which the repo keeps, downstream
    block included: the page's figures cannot drift from a run the repo can show."""
    from bertblocks.ablation.doctables import find_blocks

    text = HOW_TO.read_text(encoding="utf-8")
    checked, titles = [], []
    for block in find_blocks(HOW_TO, text):
        # the study's name, without loading it (the plugin study needs a plugin this suite does not autoload)
        names = [o.removeprefix("name=") for o in block.overrides if o.startswith("name=")]
        title = names[-1] if names else yaml.safe_load(block.study.read_text(encoding="utf-8"))["name"]
        titles.append(title)
        results = KEPT / title / "results.json"
        if results.is_file():
            assert text[block.start : block.end] == "```text\n" + table_from_results(results) + "\n```\n", results
            checked.append(results.parent.name)
    assert checked == titles  # every table of the page has its results kept
    assert {"modern-encoder", "modern-encoder-600"} <= set(checked)
    modern = json.loads((KEPT / "modern-encoder" / "results.json").read_text(encoding="utf-8"))
    seeds = {run["seed"] for v in modern["variants"] for run in v["runs"]}
    assert len(seeds) >= 3
    assert all(v["downstream_runs"] for v in modern["variants"])


def test_from_scratch_is_a_reserved_variant_name_and_can_be_switched_off(tmp_path):
    path = write_study(tmp_path, vary={}, variants={"from-scratch": {"position.name": "absolute"}})
    with pytest.raises(StudyError, match="'from-scratch' names the downstream control row"):
        load_study(path)
    assert load_study(write_study(tmp_path, from_scratch=False)).spec.from_scratch is False
    assert load_study(write_study(tmp_path)).spec.from_scratch is True  # on by default
