"""The shipped examples work as their comments say: the quickstart script, and every command written at the top
of every example config."""

from __future__ import annotations

import math
import re
import runpy
import shlex
from pathlib import Path

import pytest

from bertblocks import cli, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.yaml"))


def test_there_are_example_configs():
    assert len(CONFIGS) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_starts_with_what_it_builds_and_how_to_run_it(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line)
    assert header, f"{path.name} must start with a comment"
    assert header[0].startswith(f"# {path.stem}: "), "the first line names the config and what it builds"
    text = "\n".join(header)
    assert f"bertblocks build examples/configs/{path.name}" in text
    assert "--set" in text, "say how to override a field"
    load_config(path)  # and it is valid


def _commands(path: Path) -> list[list[str]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"#\s+bertblocks (.+)$", line)
        if match:
            out.append(shlex.split(match.group(1)))
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_command_in_an_example_config_runs(path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name the file relative to the repository root
    commands = _commands(path)
    assert commands
    for argv in commands:
        assert argv[0] in cli.SUBCOMMANDS, argv
        code = cli.main(argv)
        captured = capsys.readouterr()
        assert code == 0, (argv, captured.err)


def test_quickstart(capsys):
    pytest.importorskip("transformers", reason="the quick start compares against transformers' BertModel")
    scope = runpy.run_path(str(ROOT / "examples" / "quickstart.py"))
    code = scope["main"]()
    out = capsys.readouterr().out
    assert code == 0, out
    diff = float(re.search(r"max \|bertblocks - transformers\| on last_hidden_state: (\S+)", out).group(1))
    assert diff <= 1e-5
    assert "sentence embeddings recomputed from those hidden states: same" in out
    # the similarity table is the real model's: the two eating sentences are the closest pair of the first row
    row = next(line for line in out.splitlines() if line.startswith("  [0]  "))
    values = [float(v) for v in row.split()[1:]]
    assert values[0] == pytest.approx(1.0, abs=1e-3)
    assert max(values[1:]) == values[1]
    assert "layers 3-5: attention: bert · eager · 12 heads; feedforward: bert · 1536 · gelu_new" in out
    # the count printed is the checkpoint's: every tensor in the file except the stale position_ids buffer
    from safetensors import safe_open

    from bertblocks.sentence import minilm_path

    with safe_open(str(minilm_path() / "model.safetensors"), "pt") as f:
        total = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if "position_ids" not in k)  # noqa: SIM118 - not a dict
    assert f"{total:,} parameters (same weights as step 1)" in out
