"""``benchmarks/bench_families.py``, the per-family table against transformers' own classes: its every code path runs
end to end on the family table's tiny settings (``--tiny``, one repeat) in a subprocess, so the script cannot rot.
No timing is asserted: only that every family of the table gets its rows, its outputs compared before timing."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from tests.families.reference import FAMILIES

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_families.py"
#: one row per family: the table's rows with a tokenizer (what the script benchmarks by default)
FAMILY_ROWS = [name for name, family in FAMILIES.items() if family.tokenizer is not None]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, check=False, timeout=900
    )


def _summary(out: str) -> dict[str, dict[str, list[str]]]:
    """The Markdown summary: family → contender → its cells."""
    rows: dict[str, dict[str, list[str]]] = {}
    for line in out.split("\nsummary:", 1)[1].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] not in ("family", "---"):
            rows.setdefault(cells[0], {})[cells[1]] = cells[2:]
    return rows


def test_every_family_of_the_table_gets_its_rows():
    done = _run("--tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.match(r"machine: .+, \d+ cores, flags .+, torch CPU capability \S+, \d+ threads, load average ", out)
    assert "bertblocks fast path: skipped" in out  # said, not silently left out
    assert "NOT TIMED" not in out
    rows = _summary(out)
    assert list(rows) == FAMILY_ROWS  # a family added to the table joins without an edit to the script
    for family, contenders in rows.items():
        named = [c for c in contenders if c != "bertblocks re-padded"]
        assert named in (["bertblocks eager"], ["bertblocks eager", "bertblocks packed"]), family
        if "bertblocks re-padded" in contenders:  # a score-bias family's packed attention re-padded: padded batch only
            assert float(contenders["bertblocks re-padded"][0]) > 0, family
            assert contenders["bertblocks re-padded"][1:] == ["-", "-"], family
        padded, uniform, step = contenders["bertblocks eager"]
        assert float(padded) > 0, family
        assert float(uniform) > 0, family
        assert step == "-" or float(step) > 0, family
        if "bertblocks packed" in contenders:  # training packs only when asked: a row of its own, for the step
            assert contenders["bertblocks packed"][:2] == ["-", "-"], family
            assert float(contenders["bertblocks packed"][2]) > 0, family
    # the families whose position scheme adds a score bias (DeBERTa's terms, MPNet's buckets) time re-padding too
    assert {"deberta-v2", "mpnet"} <= {
        family for family, contenders in rows.items() if "bertblocks re-padded" in contenders
    }
    # each family's outputs compared with transformers' before timing: two batches and the fine-tuning step
    diffs = re.findall(r"bertblocks eager: max abs diff to transformers (\S+)", out)
    assert len(diffs) >= 2 * len(FAMILY_ROWS)
    assert all(float(d) <= 1e-4 for d in diffs)
    # the fine-tuning step runs for every family that has a sequence classifier in transformers (all but a few)
    assert sum(contenders["bertblocks eager"][2] != "-" for contenders in rows.values()) >= len(rows) - 1


def test_an_unknown_family_is_refused_naming_the_table():
    done = _run("--tiny", "--families", "bert-nonexistent")
    assert done.returncode != 0
    assert "unknown families ['bert-nonexistent']" in done.stderr
    assert "deberta-v2" in done.stderr  # what the table has


def test_a_contender_that_differs_from_transformers_is_not_timed(capsys):
    bench = runpy.run_path(str(SCRIPT))
    contenders = {"transformers": lambda: 1.0, "good": lambda: 1.0, "broken": lambda: 2.0}
    kept = bench["_checked"](contenders, 1.0, lambda a, b: abs(a - b))
    assert list(kept) == ["transformers", "good"]
    out = capsys.readouterr().out
    assert "broken: max abs diff to transformers 1.0e+00" in out
    assert "NOT TIMED (outputs differ)" in out


@pytest.mark.compile
def test_the_fast_path_runs_and_matches():
    done = _run("--tiny", "--families", "roberta", "--fast-path")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NOT TIMED" not in done.stdout
    rows = _summary(done.stdout)
    assert list(rows["roberta"]) == ["bertblocks eager", "bertblocks fast path", "bertblocks packed"]
    assert rows["roberta"]["bertblocks fast path"][2] == "-"  # inference only
    assert len(re.findall(r"bertblocks fast path: max abs diff to transformers", done.stdout)) == 2
