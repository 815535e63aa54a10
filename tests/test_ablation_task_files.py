"""Downstream task files someone may send you: each finding below was a raw error, a silently wrong task, or
an error after all pre-training; now each is a StudyError naming the file and line, raised before anything
is written (the study's output folder does not exist afterwards), and the bootstrap's memory is bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_ablation_downstream import write_study

from bertblocks.ablation import StudyError, load_study, run_study
from bertblocks.ablation import downstream as ds
from bertblocks.ablation.corpus import generate_sentences
from bertblocks.ablation.data import train_tokenizer
from bertblocks.ablation.tasks import TaskDataError, read_examples


def refused(folder: Path, task: dict[str, Any], pattern: str) -> str:
    """Run the study with ``task`` and return the error, checking that nothing was written."""
    out = folder / "out"
    study = write_study(folder, downstream=[{"kind": "classification", "steps": 1, **task}])
    with pytest.raises(StudyError, match=pattern) as info:
        run_study(study, out, workers=0, progress=False, echo=None)
    assert not out.exists(), "refused before pre-training: nothing written"
    return str(info.value)


def rows(n: int, label: Any = lambda i: i % 2) -> str:
    return "".join(f"the cat runs {i} .,{label(i)}\n" for i in range(n))


def test_a_csv_field_over_the_limit_names_the_file_and_line(tmp_path):
    (tmp_path / "t.csv").write_text("sentence,label\n" + rows(4) + "x" * 200_000 + ",1\n")
    refused(tmp_path, {"source": "t.csv"}, r"downstream\.0\.source: .*t\.csv, line 6: not valid CSV: a field longer")


def test_a_csv_saved_by_excel_with_a_bom_is_read(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfsentence,label\n" + rows(4).encode())
    examples = read_examples(path, "sentence", None, "label")
    assert [(e.text, e.label) for e in examples[:2]] == [("the cat runs 0 .", "0"), ("the cat runs 1 .", "1")]
    assert examples[1].where == f"{path}, line 3"


def test_a_missing_column_is_named_with_the_header(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text,label\n" + rows(3))
    with pytest.raises(
        TaskDataError, match=r"t\.csv, line 1: no column\(s\) 'sentence' in the header \(columns: 'text'"
    ):
        read_examples(path, "sentence", None, "label")


def test_an_unclosed_quote_does_not_swallow_rows_into_one_class(tmp_path):
    body = rows(3) + '"an open quote,1\n' + rows(20) + 'end",0\n' + rows(3)
    (tmp_path / "t.csv").write_text("sentence,label\n" + body)
    refused(tmp_path, {"source": "t.csv"}, r"t\.csv, line 5: a field holds a line break \(an unclosed quote\?\)")


def test_a_folder_named_like_a_task_file_is_refused(tmp_path):
    (tmp_path / "t.csv").mkdir()
    refused(tmp_path, {"source": "t.csv"}, r"downstream\.0\.source: .*t\.csv: is a folder, not a file")


@pytest.mark.parametrize(
    ("label", "what"),
    [(-1, "-1"), (1.5, "1.5"), ('"-2"', "'-2'")],
)
def test_a_class_label_that_is_not_a_non_negative_integer_names_the_file_and_line(tmp_path, label, what):
    lines = [json.dumps({"sentence": f"the cat runs {i} .", "label": i % 2}) for i in range(6)]
    lines[3] = lines[3].replace('"label": 1', f'"label": {label}')
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    message = refused(tmp_path, {"source": "t.jsonl"}, r"downstream\.0\.columns\.label: .*t\.jsonl, line 4: ")
    assert f"the class label {what} is not a non-negative integer" in message


def test_a_similarity_score_that_is_not_finite_names_the_file_and_line(tmp_path):
    (tmp_path / "t.csv").write_text("sentence1,sentence2,label\n" + "a cat,a dog,1.5\n" * 4 + "a cat,a dog,nan\n")
    task = {"source": "t.csv", "kind": "similarity-regression", "metrics": ["pearson"]}
    out = tmp_path / "out"
    with pytest.raises(StudyError, match=r"t\.csv, line 6: the similarity score 'nan' is not a finite number"):
        run_study(write_study(tmp_path, downstream=[{"steps": 1, **task}]), out, workers=0, progress=False, echo=None)
    assert not out.exists()


def _prepared(folder: Path, source: str) -> ds.DownstreamData:
    study = load_study(write_study(folder, downstream=[{"source": source, "kind": "classification"}]))
    tokenizer = train_tokenizer(generate_sentences(300, seed=0), 200)
    return ds.prepare_downstream(study, tokenizer)[0]


def test_labels_1_and_1_0_are_one_class(tmp_path):
    labels = [1, 1.0, 0, "1", "0.0", 0]
    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps({"sentence": f"the cat runs {i} .", "label": y}) + "\n" for i, y in enumerate(labels))
    )
    data = _prepared(tmp_path, "t.jsonl")
    assert data.num_labels == 2
    assert data.label_names is None
    assert torch.cat([data.train_labels, data.eval_labels]).tolist() == [1, 1, 0, 1, 0, 0]
    # among class names, a number is named by its integer value: 1 and 1.0 still one class
    named = ["yes", 1, 1.0, "no", "yes", 1]
    (tmp_path / "n.jsonl").write_text(
        "".join(json.dumps({"sentence": f"the cat runs {i} .", "label": y}) + "\n" for i, y in enumerate(named))
    )
    data = _prepared(tmp_path, "n.jsonl")
    assert data.label_names == ["1", "no", "yes"]


def test_thousands_of_classes_are_refused_before_training_naming_the_task_and_the_limit(tmp_path):
    (tmp_path / "t.csv").write_text("sentence,label\n" + rows(3000, label=lambda i: i))
    message = refused(tmp_path, {"source": "t.csv", "name": "many"}, r"downstream\.0\.columns\.label: task 'many'")
    assert f"has 3,000 classes, more than the {ds.MAX_LABELS:,} a downstream task may have" in message


# ------------------------------------------------------------------------------------------------ bootstrap
def _one_hot_macro_f1(pred: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """The earlier formula: one-hot [B, n, classes] (what asked for 10.7 GB with 3,000 classes)."""
    classes = int(max(pred.max(), gold.max())) + 1
    p = torch.nn.functional.one_hot(pred, classes).double()
    g = torch.nn.functional.one_hot(gold, classes).double()
    tp = (p * g).sum(-2)
    denominator = 2 * tp + (p * (1 - g)).sum(-2) + ((1 - p) * g).sum(-2)
    present = denominator > 0
    f1 = torch.where(present, 2 * tp / denominator.clamp(min=1), torch.zeros_like(tp))
    return f1.sum(-1) / present.sum(-1).clamp(min=1)


def test_macro_f1_by_counts_equals_the_one_hot_formula():
    generator = torch.Generator().manual_seed(0)
    pred, gold = (
        torch.randint(0, 40, (30, 200), generator=generator),
        torch.randint(0, 50, (30, 200), generator=generator),
    )
    assert torch.equal(ds.metric_batch("f1", pred, gold), _one_hot_macro_f1(pred, gold))


def test_the_bootstrap_in_chunks_gives_the_same_interval(monkeypatch):
    generator = torch.Generator().manual_seed(1)
    gold = torch.randint(0, 30, (120,), generator=generator).tolist()
    preds = {seed: torch.randint(0, 30, (120,), generator=generator).tolist() for seed in range(3)}
    whole = ds.bootstrap_interval("f1", gold, preds, resamples=200)
    assert ds.bootstrap_chunk("f1", 120, 30) >= 200  # small: one chunk
    assert ds.bootstrap_chunk("f1", 10**6, 3000, budget=64 * 2**20) == 1  # large: one resample at a time
    monkeypatch.setattr(ds, "bootstrap_chunk", lambda metric, n, classes: 7)
    assert ds.bootstrap_interval("f1", gold, preds, resamples=200) == whole
    assert torch.equal(torch.cat(list(ds.resample_chunks(50, 200, 7))), ds.resample_indices(50, 200))
