"""``bertblocks embed --head splade|colbert|bge_m3`` (run as a subprocess, the installed console script) writes the
documented sparse and multi-vector formats, each record equal to the head's output for that text alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import bertblocks
from bertblocks import BertTokenizer, cli
from bertblocks.cli.embed import embed_retrieval
from bertblocks.sentence import encode_colbert
from tests.conftest import TINY
from tests.tolerances import assert_close

WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
TEXTS = ["alpha beta gamma", "delta", "eps zeta eta theta iota kappa alpha", "beta beta"]


def _folder(tmp_path_factory, name: str, head: str | None) -> Path:
    directory = tmp_path_factory.mktemp(name)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz")
    vocab += [f"[unused{i}]" for i in range(99 - len(vocab))]
    BertTokenizer.from_vocab(vocab, model_max_length=64).save_pretrained(directory)
    torch.manual_seed(0)
    model = bertblocks.create_model({**TINY, "head": head} if head else TINY)
    if head == "splade":
        with torch.no_grad():
            model.cls.predictions.bias.normal_(std=2.0)  # some logits well above 0: a non-trivial sparse vector
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    splade = _folder(tmp_path_factory, "splade", "splade")
    colbert = _folder(tmp_path_factory, "colbert", "colbert")
    bge = _folder(tmp_path_factory, "bge", None)  # a backbone, and BGE-M3's head files beside it
    torch.manual_seed(1)  # [PAD] [UNK] [CLS] [SEP] are ids 0-3 here too: the default special ids fit
    save_file({"weight": torch.randn(32, 32) * 0.2, "bias": torch.randn(32) * 0.1}, str(bge / "colbert_linear.pt"))
    save_file({"weight": torch.randn(1, 32), "bias": torch.tensor([0.5])}, str(bge / "sparse_linear.pt"))
    return {"splade": splade, "colbert": colbert, "bge_m3": bge}


def _embed(folder: Path, head: str, output: Path, *extra: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "bertblocks"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [str(script), "embed", "--model", str(folder), "--head", head, "-o", str(output), "--batch-size", "3"]
    return subprocess.run([*argv, *extra, *TEXTS], capture_output=True, text=True, env=env, timeout=300)


def _alone(folder: Path, head: str, text: str):
    model = bertblocks.from_pretrained(folder, head=head).eval()  # BGE-M3's head files included
    tokenizer = BertTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return model(**tokenizer([text]))


@pytest.mark.parametrize("head", ["splade", "bge_m3"])
def test_sparse_jsonl_holds_indices_and_values(folders, tmp_path, head):
    output = tmp_path / "out.jsonl"
    done = _embed(folders[head], head, output)
    assert done.returncode == 0, done.stderr
    assert f"4 texts embedded by the {head} head" in done.stdout
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in records] == TEXTS
    assert any(r["indices"] for r in records)  # not vacuous: some weights are non-zero
    for record in records:
        want = _alone(folders[head], head, record["text"]).sparse_embedding[0]
        assert record["indices"] == want.nonzero().flatten().tolist()  # ascending, the non-zero ids only
        assert_close(torch.tensor(record["values"]), want[want != 0])
        if head == "bge_m3":
            out = _alone(folders[head], head, record["text"])
            assert_close(torch.tensor(record["embedding"]), out.dense_embedding[0])
            assert_close(torch.tensor(record["vectors"]), out.colbert_embedding[0])  # [tokens - 1, H]


@pytest.mark.parametrize("head", ["colbert", "bge_m3"])
def test_safetensors_holds_csr_sparse_and_masked_multivectors(folders, tmp_path, head):
    output = tmp_path / "out.safetensors"
    done = _embed(folders[head], head, output)
    assert done.returncode == 0, done.stderr
    with safe_open(str(output), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
        metadata = f.metadata()
    field, mask_field = (
        ("token_embeddings", "token_mask") if head == "colbert" else ("colbert_embedding", "colbert_mask")
    )
    lengths = tensors["multivector_mask"].sum(-1)
    for i, text in enumerate(TEXTS):
        out = _alone(folders[head], head, text)
        n = int(out[mask_field][0].sum())
        assert int(lengths[i]) == n
        assert_close(tensors["multivector"][i, :n], out[field][0, :n])
        assert tensors["multivector"][i, n:].abs().sum() == 0  # zeros past the text's tokens
        if head == "bge_m3":
            start, end = tensors["sparse_indptr"][i : i + 2].tolist()
            want = out.sparse_embedding[0]
            assert tensors["sparse_indices"][start:end].tolist() == want.nonzero().flatten().tolist()
            assert_close(tensors["sparse_values"][start:end], want[want != 0])
            assert_close(tensors["dense"][i], out.dense_embedding[0])
    if head == "bge_m3":
        assert metadata["sparse_width"] == "99"
        assert tensors["sparse_indptr"].shape == (len(TEXTS) + 1,)


def test_a_head_without_weights_and_a_wrong_suffix_are_refused(folders, tmp_path):
    done = _embed(folders["bge_m3"], "colbert", tmp_path / "out.jsonl")  # a backbone: no `linear` weights
    assert done.returncode == cli.EXIT_INVALID, done.stderr
    assert "holds no weights for the colbert head (linear.weight)" in done.stderr
    done = _embed(folders["splade"], "splade", tmp_path / "out.npy")
    assert done.returncode == cli.EXIT_INVALID
    assert "--head splade writes .jsonl or .safetensors" in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_colbert_queries_and_documents_follow_colberts_convention(folders, tmp_path):
    """``--colbert query`` (the command, with the head's option set by ``--set``) and ``colbert="document"`` (the
    function it calls): what ``encode_colbert`` gives for each text alone (the marker, an augmented query of
    ``head.query_length`` vectors)."""
    output = tmp_path / "out.safetensors"
    done = _embed(folders["colbert"], "colbert", output, "--colbert", "query", "--set", "head.query_length=12")
    assert done.returncode == 0, done.stderr
    with safe_open(str(output), "pt") as f:
        queries = [f.get_tensor("multivector")[i][f.get_tensor("multivector_mask")[i].bool()] for i in range(4)]
    model = bertblocks.from_pretrained(folders["colbert"], ["head.query_length=12"], head="colbert").eval()
    tokenizer = BertTokenizer.from_pretrained(folders["colbert"])
    documents = embed_retrieval(model, tokenizer, TEXTS, "colbert", batch_size=3, colbert="document").multivector
    assert documents is not None
    for role, got in (("query", queries), ("document", documents)):
        for i, text in enumerate(TEXTS):
            want, keep = encode_colbert(model, tokenizer, [text], is_query=role == "query")
            n = 12 if role == "query" else len(tokenizer(text)["input_ids"][0]) + 1  # + the [D] marker
            assert int(keep.sum()) == got[i].shape[0] == n
            assert_close(got[i], want[0][keep[0].bool()], what=f"{role} {i}")


def test_colbert_role_needs_the_colbert_head_and_its_own_lengths(folders, tmp_path, capsys):
    """Refused before anything is loaded (in process: no subprocess needed for an argument check)."""
    base = ["embed", "--model", str(folders["colbert"]), "-o", str(tmp_path / "out.jsonl"), *TEXTS]
    assert cli.main([*base, "--head", "splade", "--colbert", "query"]) == cli.EXIT_INVALID
    assert "--colbert query needs --head colbert (got --head splade)" in capsys.readouterr().err
    assert cli.main([*base, "--head", "colbert", "--colbert", "document", "--max-length", "8"]) == cli.EXIT_INVALID
    assert "--colbert takes its lengths from the head's options" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
