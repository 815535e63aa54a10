"""The long-context benchmarks (``benchmarks/bench_longformer.py``, ``bench_nystrom.py``, ``bench_block_sparse.py``)
and their one harness (``benchmarks/long_context.py``): every contender of every script builds and runs at a tiny
size and lands in the table, the timing loop rotates the order, and a memory process reports its peak. No timing is
asserted.

The memory processes are replaced by a stub in the table runs (each would import torch again, seconds apiece); one
real memory process runs on its own."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TINY_LONGFORMER = ["--lengths", "64", "--repeats", "1", "--hidden", "32", "--layers", "1", "--heads", "2"]
#: script, its tiny arguments, its contenders (the base first)
SCRIPTS = {
    "bench_longformer.py": (
        [*TINY_LONGFORMER, "--window", "16"],
        ["longformer", "full-eager", "full-sdpa", "hf-longformer"],
    ),
    "bench_nystrom.py": (
        [*TINY_LONGFORMER, "--landmarks", "8", "--conv", "3"],
        ["nystrom", "full-eager", "full-sdpa", "hf-nystromformer"],
    ),
    # the shortest length that takes BigBird's sparse path: (5 + 2 · 3 random) blocks of 64
    "bench_block_sparse.py": (
        ["--lengths", "704", "--repeats", "1", "--layers", "1", "--threads", "1"],
        ["block_sparse", "full_sdpa", "full_eager"],
    ),
}


def _script(name: str) -> dict[str, Any]:
    """The script's globals (its ``main`` not run); ``long_context`` importable as the scripts import it."""
    return runpy.run_path(str(BENCHMARKS / name))


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_every_contender_builds_runs_and_gets_its_row(
    script: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    argv, contenders = SCRIPTS[script]
    main = _script(script)["main"]
    harness = sys.modules["long_context"]
    asked: list[tuple[list[str], int]] = []

    def peaks(path: str, args: list[str], names: list[str], length: int) -> dict[str, float]:
        assert Path(path) == BENCHMARKS / script  # the memory processes run the script itself
        asked.append((list(args), length))
        return {name: 10.0 * (i + 1) for i, name in enumerate(names)}

    monkeypatch.setattr(harness, "peaks", peaks)
    main(argv)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("machine: ")
    assert out[2].split()[:3] == ["L", "contender", "ms"]
    rows = [line.split() for line in out[3:]]
    assert [row[1] for row in rows] == contenders
    length = int(argv[1])
    for i, row in enumerate(rows):
        assert int(row[0]) == length
        assert float(row[2]) > 0
        assert float(row[4]) == 10.0 * (i + 1)
        assert float(row[5]) == pytest.approx(i + 1, abs=0.01)  # the ratio to the base, the first contender
    assert rows[0][3] == "1.00"
    assert asked == [(argv, length)]  # the children get the script's own arguments


def test_the_timing_loop_warms_up_each_once_then_rotates_the_order():
    _script("bench_longformer.py")
    harness = sys.modules["long_context"]
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    medians = harness.interleaved_medians(fns, repeats=3)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert list(medians) == list("abc")
    assert all(value >= 0 for value in medians.values())


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the CPU peak reads Linux's /proc")
def test_a_memory_process_reports_the_peak_its_forward_pass_adds():
    argv, _ = SCRIPTS["bench_longformer.py"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(BENCHMARKS / "bench_longformer.py"), *argv, "--child", "full-eager", "1024"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    peak = json.loads(done.stdout.strip().splitlines()[-1])["peak_added_mib"]
    # at least half the eager scores of one layer (2 heads x 1024 x 1024 fp32: 8 MiB); far below a whole process
    assert 4 <= peak < 500


def test_an_unknown_contender_is_refused_naming_the_known_ones(capsys: pytest.CaptureFixture[str]):
    main = _script("bench_nystrom.py")["main"]
    with pytest.raises(SystemExit) as exit_:
        main(["--child", "nobody", "64"])
    assert exit_.value.code == 2
    known = "nystrom, full-eager, full-sdpa, hf-nystromformer"
    assert f"unknown contender 'nobody' (one of {known})" in capsys.readouterr().err
