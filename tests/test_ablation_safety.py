"""Ablation studies that never lose or mix results: one study per output folder, runs keyed by everything
that affects them (a changed setting re-runs exactly what it affects), and a diverging variant recorded
as such while the report is written for all the others."""

from __future__ import annotations

import csv
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_ablation import write_study

from bertblocks.ablation import executors, run_study
from bertblocks.ablation.lock import LOCK_FILE, FolderLock, StudyLockedError
from bertblocks.cli import main
from bertblocks.registry import BuildError
from bertblocks.registry.errors import DuplicateComponentError, PluginLoadError, UnknownComponentError

NAMED = {"abs": {"position.name": "absolute"}, "rel": {"position.name": "relative_key"}}
SHORT_TRAIN = {"task": "mlm", "steps": 2, "batch_size": 4, "seq_len": 16, "seeds": [0], "eval_batches": 1}


def small_study(folder: Path, **changes: Any) -> Path:
    """Two named variants x one seed, two training steps: each run takes a moment."""
    settings: dict[str, Any] = {
        "vary": {},
        "variants": NAMED,
        "measure": {"batch": 1, "seq_len": 8, "repeats": 1, "warmup": 0, "metrics": ["params"]},
        "train": SHORT_TRAIN,
        "corpus": {"sentences": 120},
        "tokenizer": {"vocab_size": 200},
    }
    return write_study(folder, **{**settings, **changes})


def run(study: Path, out: Path) -> Any:
    return run_study(study, out, workers=0, progress=False, echo=None)


def edit(study: Path, change: Any) -> None:
    data = yaml.safe_load(study.read_text())
    change(data)
    study.write_text(yaml.safe_dump(data, sort_keys=False))


# ------------------------------------------------------------------------------------------------- lock
def test_a_study_into_a_folder_another_holds_is_refused_and_writes_nothing(tmp_path):
    study = small_study(tmp_path)
    out = tmp_path / "out"
    with FolderLock(out):
        with pytest.raises(StudyLockedError) as info:
            run(study, out)
        assert f"another study is writing to {out} (process {os.getpid()} on " in str(info.value)
        assert "--out" in str(info.value)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing of the refused study
    result = run(study, out)  # released: the same study now runs
    assert len(result.executed) == 2


def _held_by(path: Path, pid: int) -> bool:
    """Whether process ``pid`` holds the study lock on ``path`` now: the lock writes its holder after taking it, so
    this reads the file and never takes the lock itself (a probe that did would make the study it waits for find the
    lock taken, at random)."""
    try:
        return json.loads(path.read_text() or "{}").get("pid") == pid
    except (OSError, ValueError):
        return False


def test_two_concurrent_studies_into_one_folder_one_refused_the_other_complete(tmp_path, capsys):
    # in its own process (no workers), with enough steps to hold the lock for some seconds; the second study
    # reaches the lock in a fraction of that
    study = small_study(tmp_path, train={**SHORT_TRAIN, "steps": 300})
    out = tmp_path / "out"
    env = {**os.environ, "BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "bertblocks.cli", "ablate", str(study), "--out", str(out), "--workers", "0"]
    command.append("--no-progress")
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _held_by(out / LOCK_FILE, first.pid):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the first study never took the lock"
        time.sleep(0.01)
    assert main(["ablate", str(study), "--out", str(out), "--no-progress", "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert f"another study is writing to {out} (process {first.pid} on " in err
    _stdout, stderr = first.communicate(timeout=240)
    assert first.returncode == 0, stderr
    with (out / "results.csv").open() as f:
        assert [row["variant"] for row in csv.DictReader(f)] == ["abs", "rel"]
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    assert [(r["variant"], r["status"]) for r in records] == [("abs", "ok"), ("rel", "ok")]
    assert len({r["fingerprint"] for r in records}) == 2


# ---------------------------------------------------------------------------------------- fingerprints
def test_a_changed_setting_reruns_exactly_the_runs_it_affects(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the cat number {i} sat on the mat near tree {i % 7}" for i in range(150)))
    study = small_study(tmp_path, corpus={"kind": "file", "path": "corpus.txt"})
    out = tmp_path / "out"
    first = run(study, out)
    assert sorted(first.executed) == sorted(r["run_id"] for r in first.records)
    assert run(study, out).executed == []  # nothing changed: everything reused

    # the tokenizer's vocabulary: every run trains on other token ids, so every run is redone
    vocab_before = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    edit(study, lambda d: d["tokenizer"].update(vocab_size=120))
    changed = run(study, out)
    assert changed.reused == []
    assert len(changed.executed) == 2
    assert len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]) < len(vocab_before)

    # one variant's setting: only that variant's runs
    edit(study, lambda d: d["variants"]["rel"].update({"position.name": "relative_key_query"}))
    one = run(study, out)
    assert [r.split("-")[0] for r in one.executed] == ["rel"]
    assert [r.split("-")[0] for r in one.reused] == ["abs"]

    # the corpus file's content (same path, same settings): the data differ, every run is redone
    corpus.write_text(corpus.read_text().replace("cat", "dog"))
    data = run(study, out)
    assert data.reused == []
    assert len(data.executed) == 2


def test_the_fingerprint_holds_the_code_version(tmp_path, monkeypatch):
    from bertblocks.ablation import provenance

    study = small_study(tmp_path)
    out = tmp_path / "out"
    run(study, out)
    monkeypatch.setattr(provenance, "source_hash", lambda: "edited-source")
    assert len(run(study, out).executed) == 2


# ------------------------------------------------------------------------------------------- divergence
def test_a_diverging_variant_is_recorded_and_the_report_is_written_for_the_others(tmp_path):
    # a huge initialiser overflows float32 in the first forward pass: the loss is NaN from step 1
    variants = {"ok": {"position.name": "absolute"}, "blowup": {"initializer_range": 1e30}}
    study = small_study(tmp_path, variants=variants, train={**SHORT_TRAIN, "seeds": [0, 1]})
    out = tmp_path / "out"
    result = run(study, out)
    assert len(result.executed) == 4
    by_name = {s.variant: s for s in result.summaries}
    assert by_name["blowup"].diverged == [0, 1]
    assert by_name["ok"].diverged == []
    assert "eval_loss" in by_name["ok"].mean
    assert "eval_loss" not in by_name["blowup"].mean
    assert by_name["blowup"].mean["params"] == by_name["ok"].mean["params"]  # costs are still measured
    assert "note: blowup: training diverged (NaN/inf loss) for seeds 0, 1" in result.table

    records = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    diverged = [r for r in records if r["variant"] == "blowup"]
    assert all(r["status"] == "diverged" and r["metrics"]["diverged_at_step"] == 1 for r in diverged)
    with (out / "results.csv").open() as f:
        rows = {row["variant"]: row for row in csv.DictReader(f)}
    assert rows["blowup"]["diverged_seeds"] == "0 1"
    assert rows["blowup"]["eval_loss"] == ""
    assert float(rows["ok"]["eval_loss"]) > 0

    def no_nan(text: str) -> None:
        raise AssertionError(f"results.json holds {text}")

    report = json.loads((out / "results.json").read_text(), parse_constant=no_nan)  # strict JSON
    assert {v["variant"]: v["diverged_seeds"] for v in report["variants"]} == {"ok": [], "blowup": [0, 1]}
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"

    (out / "results.csv").unlink()
    again = run(study, out)  # resuming reuses the diverged runs too, and writes the report again
    assert again.executed == []
    assert (out / "results.csv").is_file()


@pytest.mark.parametrize(
    "error",
    [
        UnknownComponentError("attention", "flash", ["bert", "eager"]),
        DuplicateComponentError("attention", "bert", "a", "b"),
        PluginLoadError("p", "dist", "boom"),
        BuildError("layer 0: no"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_registry_errors_cross_process_boundaries(error: Exception) -> None:
    # a run's error comes back from a worker process by pickle; one that cannot be rebuilt breaks the pool
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)


def test_a_run_error_pickle_cannot_rebuild_comes_back_as_a_run_failed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class StubbornError(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"needs {a} and {b}")

    def fail(task: Any) -> dict[str, Any]:
        raise StubbornError(1, 2)

    monkeypatch.setattr(executors, "execute", fail)
    with pytest.raises(executors.RunFailedError) as caught:
        executors.execute_portably(None)  # type: ignore[arg-type]
    back = pickle.loads(pickle.dumps(caught.value))
    assert executors.describe(back) == "StubbornError: needs 1 and 2"


# ----------------------------------------------------------------------------- bad leftovers in the folder
@pytest.fixture
def finished(tmp_path: Path) -> tuple[Path, Path]:
    """A study run once: its file and its output folder."""
    study = small_study(tmp_path)
    out = tmp_path / "out"
    run(study, out)
    return study, out


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda record: b"[1, 2]", "holds a JSON list, not a run record (an object)"),
        (lambda record: b'"ok"', "holds a JSON str, not a run record (an object)"),
        (
            lambda record: json.dumps({k: v for k, v in record.items() if k != "metrics"}).encode(),
            "is not a complete run record (missing or mistyped: 'metrics' (an object))",
        ),
        (
            lambda record: json.dumps({**record, "seed": "0"}).encode(),
            "is not a complete run record (missing or mistyped: 'seed' (an integer))",
        ),
        (lambda record: b"\xff\xfe\x00garbage\x80", "is not UTF-8 text (byte 0xff at column 1)"),
        (lambda record: b'{"fingerprint": ', "is not JSON (Expecting value at column 17)"),
    ],
    ids=["list", "string", "no-metrics", "seed-as-text", "binary", "cut-short"],
)
def test_an_unusable_run_record_is_named_and_run_again(finished, caplog, damage, reason):
    study, out = finished
    path = sorted((out / "runs").glob("abs-*.json"))[0]
    record = json.loads(path.read_text())
    path.write_bytes(damage(record))
    with caplog.at_level("WARNING", logger="bertblocks"):
        again = run(study, out)
    assert f"run record {path} {reason}" in caplog.text
    assert [r.split("-")[0] for r in again.executed] == ["abs"]
    assert [r.split("-")[0] for r in again.reused] == ["rel"]
    rerun = json.loads(path.read_text())  # replaced by the rerun: the same numbers, all but the timings
    assert rerun["fingerprint"] == record["fingerprint"]
    assert rerun["metrics"]["params"] == record["metrics"]["params"]
    assert len(list(csv.DictReader((out / "results.csv").open()))) == 2


def test_a_damaged_tokenizer_in_the_output_folder_is_named_and_trained_again(finished, caplog):
    study, out = finished
    (out / "tokenizer.json").write_bytes(b"{not a tokenizer")
    with caplog.at_level("WARNING", logger="bertblocks"):
        again = run(study, out)
    assert f"{out / 'tokenizer.json'} is not a readable tokenizer" in caplog.text
    assert "training a new one" in caplog.text
    json.loads((out / "tokenizer.json").read_text())  # rewritten whole
    # the frequency trainer is deterministic: the same tokenizer, so the runs' fingerprints still hold
    assert again.executed == []
    (out / "tokenizer.key").write_bytes(b"\xff\xfe")  # an unreadable key: no match, trained again
    assert run(study, out).executed == []


def test_a_study_tokenizer_file_that_is_not_a_tokenizer_is_refused_with_its_path(tmp_path, capsys):
    (tmp_path / "broken.json").write_text('{"model": 3}')
    study = small_study(tmp_path, tokenizer={"path": "broken.json"})
    assert main(["ablate", str(study), "--out", str(tmp_path / "out"), "--workers", "0", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"tokenizer.path: {tmp_path / 'broken.json'} is not a tokenizer.json file" in err
    assert "bug" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["train.steps=3", "train.seeds.5=1"],
            "train.seeds.5: no item '5' in a list of 1 (from --set #2 'train.seeds.5=1')",
        ),
        (["train.steps"], "override 'train.steps' is not of the form dotted.key=value (from --set #1 'train.steps')"),
        (
            ["train.steps=3", "measure=3"],
            "measure: Input should be a valid dictionary or instance of MeasureSpec (from --set #2 'measure=3')",
        ),
        (["train.steps=[3"], "train.steps: cannot read the value '[3' as YAML"),
    ],
)
def test_set_errors_name_which_set(tmp_path, capsys, sets, message):
    study = small_study(tmp_path)
    arguments = [a for text in sets for a in ("--set", text)]
    assert main(["ablate", str(study), "--out", str(tmp_path / "out"), "--workers", "0", *arguments]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "bug" not in err


def test_a_corpus_line_that_is_not_utf8_is_named_with_its_file_and_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"the cat sat\n\nthe dog \xff sat\n")
    study = small_study(tmp_path, corpus={"kind": "file", "path": "corpus.txt"})
    assert main(["ablate", str(study), "--out", str(tmp_path / "out"), "--workers", "0", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"corpus.path: {corpus}, line 3: not UTF-8 text (byte 0xff at column 9)" in err
    assert "bug" not in err


def test_labelled_corpus_line_numbers_count_blank_lines(tmp_path):
    from bertblocks.ablation.corpus import read_labelled

    corpus = tmp_path / "labelled.txt"
    corpus.write_bytes(b"1\tgood film\n\n0\tbad film\nno label here\n")
    with pytest.raises(ValueError, match=r"labelled\.txt, line 4: expected LABEL<TAB>TEXT"):
        read_labelled(corpus)
    corpus.write_bytes(b"1\tgood film\n\n0\tbad film\n")
    assert read_labelled(corpus) == [("good film", 1), ("bad film", 0)]
