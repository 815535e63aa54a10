"""``bertblocks embed`` on a corpus: file or stdin, lines or JSONL, batch size, .npy/.jsonl output in input order,
equal to the Python API; progress only on a terminal; clear errors."""

from __future__ import annotations

import io
import json
import logging
import random

import numpy as np
import pytest
import torch

from bertblocks import BertModel, BertTokenizer, cli, create_model, sentence
from bertblocks.cli.embed import embed_corpus
from tests.conftest import TINY
from tests.tolerances import assert_close

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("bertblocks").setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny model with its own WordPiece tokenizer, saved as a checkpoint directory."""
    directory = tmp_path_factory.mktemp("tiny")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz")
    vocab += [f"[unused{i}]" for i in range(99 - len(vocab))]
    tokenizer = BertTokenizer.from_vocab(vocab, model_max_length=64)
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    create_model(TINY).save_pretrained(directory)
    return directory


def _corpus(n: int = 1000) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def _python_api(checkpoint, texts: list[str]) -> np.ndarray:
    model = BertModel.from_pretrained(checkpoint).eval()
    tokenizer = BertTokenizer.from_pretrained(checkpoint)
    return sentence.encode(model, tokenizer, texts, batch_size=len(texts)).numpy()


def test_thousand_line_file_to_npy_in_input_order(checkpoint, tmp_path, capsys):
    texts = _corpus()
    (tmp_path / "corpus.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    code = cli.main(
        [
            "embed",
            "--model",
            str(checkpoint),
            "--input",
            str(tmp_path / "corpus.txt"),
            "--batch-size",
            "64",
            "--output",
            str(tmp_path / "out.npy"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"1000 embeddings of dimension 32 (mean-pooled, L2-normalised) → {tmp_path / 'out.npy'}" in out
    assert err == ""  # not a terminal: no progress bar
    got = np.load(tmp_path / "out.npy")
    assert got.shape == (1000, 32)
    assert got.dtype == np.float32
    assert_close(torch.from_numpy(got), torch.from_numpy(_python_api(checkpoint, texts)))  # other batching


def test_jsonl_from_stdin_to_jsonl(checkpoint, tmp_path, capsys, monkeypatch):
    texts = _corpus(20)
    lines = "".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts))
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    output = tmp_path / "out.jsonl"
    argv = ["embed", "--model", str(checkpoint), "-i", "-", "--input-format", "jsonl", "--text-field", "body"]
    assert cli.main([*argv, "--batch-size", "3", "-o", str(output)]) == 0
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in records] == texts
    got = torch.tensor([r["embedding"] for r in records])
    assert_close(got, torch.from_numpy(_python_api(checkpoint, texts)))


def test_texts_piped_without_input_flag(checkpoint, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("alpha beta\n\ngamma\n"))
    assert cli.main(["embed", "--model", str(checkpoint), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["shape"] == [2, 32]  # the empty line is skipped
    assert [e["text"] for e in data["embeddings"]] == ["alpha beta", "gamma"]


def test_length_sorted_batches_equal_unsorted(checkpoint):
    model = BertModel.from_pretrained(checkpoint).eval()
    tokenizer = BertTokenizer.from_pretrained(checkpoint)
    texts = _corpus(50)
    sorted_batches = embed_corpus(model, tokenizer, texts, batch_size=7)
    one_by_one = torch.cat([sentence.encode(model, tokenizer, [t]) for t in texts])
    assert_close(sorted_batches, one_by_one)  # other padding, other GEMM shapes


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--input", "missing.txt"], "input file not found: missing.txt"),
        (["--output", "out.csv", "hi"], "the suffix must be one of .npy, .jsonl"),
        (["--batch-size", "0", "hi"], "--batch-size must be at least 1"),
        (["--input", "bad.jsonl"], "bad.jsonl, line 2: expected an object with a string 'text' field"),
        (["--input", "corpus.txt", "hi"], "give texts as arguments or --input, not both"),
    ],
)
def test_bad_input_is_a_clear_error(checkpoint, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": "no"}\n', encoding="utf-8")
    (tmp_path / "corpus.txt").write_text("alpha\n", encoding="utf-8")
    assert cli.main(["embed", "--model", str(checkpoint), *argv]) == cli.EXIT_INVALID
    assert message in capsys.readouterr().err


def test_progress_bar_on_a_terminal(checkpoint, capsys):
    model = BertModel.from_pretrained(checkpoint).eval()
    tokenizer = BertTokenizer.from_pretrained(checkpoint)
    embed_corpus(model, tokenizer, _corpus(10), batch_size=4, progress=True)
    assert "10/10" in capsys.readouterr().err
