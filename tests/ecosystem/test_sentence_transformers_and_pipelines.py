"""sentence-transformers and transformers pipelines with bertblocks models, the real libraries on MiniLM."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

import bertblocks
from bertblocks import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertblocks.integrations.sentence_transformers import MODULE_TYPE, BertblocksModule, load_pipeline
from bertblocks.sentence import minilm_path
from tests.tolerances import assert_close

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread, slowly, on a bench in the sun.",
    "The sky is blue.",
    "x",
]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("bertblocks").setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    """sentence-transformers' own all-MiniLM-L6-v2 (its Transformer, Pooling and Normalize modules)."""
    return SentenceTransformer(str(minilm_path()), device="cpu").encode(TEXTS, convert_to_numpy=True)


def _pipeline() -> SentenceTransformer:
    encoder = BertblocksModule(minilm_path(), max_seq_length=256)
    modules = [encoder, Pooling(encoder.get_embedding_dimension(), "mean"), Normalize()]
    return SentenceTransformer(modules=modules, device="cpu")


def test_sentence_transformer_with_a_bertblocks_module_equals_sentence_transformers(reference):
    pipeline = _pipeline()
    assert isinstance(pipeline[0].auto_model, BertModel)
    assert_close(torch.from_numpy(pipeline.encode(TEXTS, convert_to_numpy=True)), torch.from_numpy(reference))


def test_saved_pipeline_loads_back(tmp_path, reference):
    _pipeline().save(str(tmp_path))
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert modules[0]["type"] == MODULE_TYPE
    loaded = load_pipeline(tmp_path, device="cpu")
    assert isinstance(loaded[0], BertblocksModule)
    assert_close(torch.from_numpy(loaded.encode(TEXTS, convert_to_numpy=True)), torch.from_numpy(reference))


def test_load_pipeline_refuses_foreign_module_types(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "evil.Module"}]))
    with pytest.raises(ValueError, match=r"outside bertblocks' allow-list: \['evil.Module'\]"):
        load_pipeline(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"modules\.json not found"):
        load_pipeline(tmp_path / "nowhere")


# -------------------------------------------------------------------------------------------- pipelines
@pytest.fixture(scope="module")
def tokenizer() -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(minilm_path())


def _same_weights(ours: torch.nn.Module, cls: str, tmp_path) -> torch.nn.Module:
    """transformers' model of the same class with our (partly newly initialised) weights."""
    ours.save_pretrained(tmp_path / cls)
    return getattr(transformers, cls).from_pretrained(tmp_path / cls).eval()


def test_feature_extraction_pipeline(tokenizer):
    ours = BertModel.from_pretrained(minilm_path()).eval()
    theirs = transformers.BertModel.from_pretrained(minilm_path()).eval()
    got = transformers.pipeline("feature-extraction", model=ours, tokenizer=tokenizer)(TEXTS[:2])
    want = transformers.pipeline("feature-extraction", model=theirs, tokenizer=tokenizer)(TEXTS[:2])
    for a, b in zip(got, want, strict=True):
        assert_close(torch.tensor(a), torch.tensor(b))


def test_fill_mask_pipeline(tokenizer, tmp_path):
    torch.manual_seed(0)
    ours = BertForMaskedLM.from_pretrained(minilm_path()).eval()
    theirs = _same_weights(ours, "BertForMaskedLM", tmp_path)
    text = "the capital of france is [MASK]."
    got = transformers.pipeline("fill-mask", model=ours, tokenizer=tokenizer)(text, top_k=3)
    want = transformers.pipeline("fill-mask", model=theirs, tokenizer=tokenizer)(text, top_k=3)
    assert [g["token"] for g in got] == [w["token"] for w in want]
    assert_close(torch.tensor([g["score"] for g in got]), torch.tensor([w["score"] for w in want]))


@pytest.mark.parametrize(
    ("task", "cls", "text"),
    [
        ("text-classification", "BertForSequenceClassification", "a great movie"),
        ("token-classification", "BertForTokenClassification", "John lives in Paris"),
    ],
)
def test_classification_pipelines(tokenizer, tmp_path, task, cls, text):
    torch.manual_seed(0)
    model_class = {
        "BertForSequenceClassification": BertForSequenceClassification,
        "BertForTokenClassification": BertForTokenClassification,
    }[cls]
    ours = model_class.from_pretrained(minilm_path(), num_labels=3).eval()
    theirs = _same_weights(ours, cls, tmp_path)
    got = transformers.pipeline(task, model=ours, tokenizer=tokenizer)(text)
    want = transformers.pipeline(task, model=theirs, tokenizer=tokenizer)(text)
    assert [g.get("label", g.get("entity")) for g in got] == [w.get("label", w.get("entity")) for w in want]
    assert_close(torch.tensor([float(g["score"]) for g in got]), torch.tensor([float(w["score"]) for w in want]))


def test_sparse_encoder_with_a_bertblocks_module_equals_sentence_transformers_and_the_splade_head(tmp_path):
    """``BertblocksModule(output="mlm_logits")`` + sentence-transformers' ``SpladePooling`` in a ``SparseEncoder``
    encodes as sentence-transformers' own ``MLMTransformer`` on the same BertForMaskedLM weights, and as
    bertblocks' ``splade`` head."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    torch.manual_seed(0)
    model = bertblocks.from_pretrained(minilm_path(), head="splade")  # MiniLM with a (fresh) MLM head
    model.save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(tmp_path)
    texts = ["A man is eating food.", "The sky is blue today, and the sun is out."]
    ours = SparseEncoder(modules=[BertblocksModule(tmp_path, output="mlm_logits"), SpladePooling("max")], device="cpu")
    theirs = SparseEncoder(modules=[MLMTransformer(str(tmp_path)), SpladePooling("max")], device="cpu")
    got = ours.encode(texts, convert_to_tensor=True).to_dense()
    want = theirs.encode(texts, convert_to_tensor=True).to_dense()
    assert got.shape == (2, model.config.vocab_size)
    assert (got > 0).any()  # not vacuous
    assert_close(got, want)
    tokenizer = bertblocks.BertTokenizer.from_pretrained(tmp_path)
    with torch.no_grad():
        head = model.eval()(**tokenizer(texts, padding=True)).sparse_embedding
    assert_close(got, head)
