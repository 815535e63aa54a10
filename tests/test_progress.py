"""Progress lines of slow steps (bertblocks.progress): on a terminal's stderr only, and the first compiled call after
optimize_for_inference says it is compiling and how long it took."""

from __future__ import annotations

import re
import sys

import pytest
import torch

import bertblocks
from bertblocks import progress
from bertblocks.models import inference
from tests.conftest import TINY

LINE = re.compile(r"compiling for inference \(first call, once per shape bucket\)… done in \d+\.\d s\n")


def _terminal(monkeypatch) -> None:
    """stderr is a terminal. Patched inside the test: capsys puts its own stream (which answers isatty() False) in
    place of sys.stderr for the test's call only."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)


def test_a_stage_prints_its_line_and_duration_on_a_terminal(monkeypatch, capsys):
    _terminal(monkeypatch)
    with progress.stage("loading x"):
        pass
    assert re.fullmatch(r"loading x… done in \d+\.\d s\n", capsys.readouterr().err)
    with pytest.raises(RuntimeError), progress.stage("tracing y"):
        raise RuntimeError("boom")
    assert re.fullmatch(r"tracing y… failed after \d+\.\d s\n", capsys.readouterr().err)
    with progress.stage("quiet z", quiet=True):  # --json: nothing
        pass
    progress.line("loading w", quiet=True)
    assert capsys.readouterr().err == ""


def test_nothing_is_printed_when_stderr_is_no_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with progress.stage("loading x"):
        pass
    progress.line("loading y")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys, "stderr", None)  # pythonw, or a process started without stderr
    assert not progress.shown()


def _identity_compile(monkeypatch):
    """torch.compile that returns the function itself: the fast path's own code runs, without Inductor's cost."""
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)


def _model():
    torch.manual_seed(0)
    return bertblocks.create_model(TINY)


def _ids(batch: int, length: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(1, TINY["vocab_size"], (batch, length))}


def test_the_first_call_after_optimize_for_inference_says_it_compiles(monkeypatch, capsys):
    _terminal(monkeypatch)
    _identity_compile(monkeypatch)
    model = bertblocks.optimize_for_inference(_model())
    model(**_ids(2, 7))
    assert LINE.fullmatch(capsys.readouterr().err)
    model(**_ids(3, 5))  # later calls reuse the graph: no line
    assert capsys.readouterr().err == ""


def test_a_failed_first_call_says_so_and_the_next_call_reports_again(monkeypatch, capsys):
    _terminal(monkeypatch)
    calls = []

    def compiled(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise RuntimeError("compile failed")
        return "out"

    fast = inference.FastCall(compiled, freeze=False)
    with pytest.raises(RuntimeError):
        fast(x=1)
    assert re.fullmatch(r"compiling for inference .*… failed after \d+\.\d s\n", capsys.readouterr().err)
    assert fast(x=2) == "out"
    assert LINE.fullmatch(capsys.readouterr().err)


def test_scripts_get_no_compile_line(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    _identity_compile(monkeypatch)
    model = bertblocks.optimize_for_inference(_model())
    model(**_ids(2, 7))
    assert capsys.readouterr().err == ""
