"""The command line's exit codes, run as a user runs it (a real process): a refused input is exit 1 with one line
naming it, never exit 4 ("a bug"); a closed stdout (``| head -1``) ends quietly with 141, as Unix tools do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertblocks import BertTokenizer, cli, create_model
from tests.conftest import TINY
from tests.test_ablation import write_study

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]


def bertblocks(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "bertblocks.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def assert_refused(result: subprocess.CompletedProcess[str], command: str, *words: str) -> None:
    """Exit 1, and stderr is one line: ``bertblocks COMMAND: error: …`` holding ``words``, no traceback."""
    assert result.returncode == cli.EXIT_INVALID, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"bertblocks {command}: error: ")
    for word in words:
        assert word in lines[0]
    assert "bug" not in lines[0]


@pytest.fixture(scope="module")
def checkpoint_of(tmp_path_factory):
    """A checkpoint whose tokenizer knows 99 tokens and up to 512 positions, with a model built from ``changes``."""

    def make(**changes: object):
        directory = tmp_path_factory.mktemp("ckpt")
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
        vocab += [f"[unused{i}]" for i in range(99 - len(vocab))]
        BertTokenizer.from_vocab(vocab, model_max_length=512).save_pretrained(directory)
        torch.manual_seed(0)
        create_model({**TINY, **changes}).save_pretrained(directory)
        return directory

    return make


def test_embed_with_a_tokenizer_larger_than_the_model_vocabulary_is_refused(checkpoint_of, tmp_path):
    directory = checkpoint_of(vocab_size=8)  # "kappa" is token 14 of the tokenizer
    result = bertblocks("embed", "--model", str(directory), "alpha kappa", cwd=tmp_path)
    assert_refused(result, "embed", "outside the vocabulary", "[0, 8)")


def test_embed_of_a_text_past_the_model_positions_is_refused(checkpoint_of, tmp_path):
    directory = checkpoint_of(max_position_embeddings=16)
    result = bertblocks("embed", "--model", str(directory), " ".join(WORDS * 3), cwd=tmp_path)
    assert_refused(result, "embed", "max_position_embeddings=16")


def test_ablate_with_a_missing_study_file_is_refused(tmp_path):
    assert_refused(bertblocks("ablate", "missing.yaml", cwd=tmp_path), "ablate", "missing.yaml")


@pytest.mark.parametrize("out", ["a-file", "a-file/below"])
def test_ablate_into_a_file_is_refused_before_anything_runs(tmp_path, out):
    study = write_study(tmp_path / "study")
    (tmp_path / "a-file").write_text("mine\n")
    result = bertblocks("ablate", str(study), "--out", out, "--no-progress", cwd=tmp_path)
    assert_refused(result, "ablate", out, "is a file" if out == "a-file" else "which is a file")
    assert (tmp_path / "a-file").read_text() == "mine\n"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["schema", "-o", "missing/schema.json"], ["missing", "does not exist"]),
        (["schema", "-o", "a-file/schema.json"], ["a-file", "is a file"]),
        (["schema", "-o", "."], ["is a directory"]),
        (["convert", "tiny-bert", "missing/tiny.yaml"], ["missing", "does not exist"]),
    ],
)
def test_writing_into_a_missing_folder_or_a_file_is_refused(tmp_path, args, words):
    (tmp_path / "a-file").write_text("mine\n")
    assert_refused(bertblocks(*args, cwd=tmp_path), args[0], *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.parametrize("args", [["presets"], ["--json", "presets"], ["schema"]])
def test_a_closed_stdout_ends_quietly_with_141(tmp_path, args):
    """``bertblocks presets | head -1``: the reader is gone before bertblocks writes (closed here first, so it is
    so every time, not by a race): no message, no traceback, exit 141 (128 + SIGPIPE)."""
    env = {**os.environ, "BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertblocks.cli", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == cli.EXIT_CLOSED_STDOUT == 141
    assert err == ""


def test_a_closed_stdout_in_a_real_pipe_to_head(tmp_path):
    env = {**os.environ, "BERTBLOCKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = f"{sys.executable} -m bertblocks.cli presets | head -1; echo status=${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("preset")
    assert lines[1] in ("status=0", "status=141")  # 0 when the table was written before head exited
    assert result.stderr == ""
