"""RemBERT (``rembert``), what only this family does: the output embedding width a language-model head chosen later
writes, and ``tie_word_embeddings: true`` tying nothing, as in transformers. Parity of every class, hidden states,
refusals, the preset and the per-family paths: the ``rembert`` row of ``tests/families/reference.py``."""

from __future__ import annotations

import json

import torch
import transformers

import bertblocks
from tests.families.reference import FAMILIES, assert_same, batch, save_hf

REMBERT = FAMILIES["rembert"]


def test_a_language_model_head_added_to_a_backbone_writes_its_own_width(tmp_path):
    """A backbone checkpoint loaded with ``head="masked_lm_gelu"`` (no width given: the hidden size) saves an
    ``output_embedding_size`` that is the head's, so transformers' RemBertForMaskedLM loads it with no mismatch."""
    save_hf(REMBERT, "RemBertModel", tmp_path / "hf")
    head = {"name": "masked_lm_gelu", "activation": "hidden_act"}
    model = bertblocks.create_model(tmp_path / "hf", head=head, pretrained=tmp_path / "hf", strict=False)
    model.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["output_embedding_size"] == REMBERT.settings["hidden_size"]
    theirs, info = transformers.RemBertForMaskedLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    inputs, mask = batch(REMBERT, "RemBertForMaskedLM")
    with torch.no_grad():
        assert_same(theirs.eval()(**inputs), model.eval()(**inputs), mask)


def test_tie_word_embeddings_true_ties_nothing_as_in_transformers(tmp_path):
    """transformers' RemBERT classes declare no tied weights: a config.json saying ``tie_word_embeddings: true``
    still has its own decoder, and bertblocks reads (and writes back) the file the same way."""
    reference = save_hf(REMBERT, "RemBertForMaskedLM", tmp_path / "hf", tie_word_embeddings=True)
    assert (
        reference.cls.predictions.decoder.weight.data_ptr()
        != reference.rembert.embeddings.word_embeddings.weight.data_ptr()
    )
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto").eval()
    assert ours.config.tie_word_embeddings is False
    inputs, mask = batch(REMBERT, "RemBertForMaskedLM")
    with torch.no_grad():
        assert_same(reference(**inputs), ours(**inputs), mask)
    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["tie_word_embeddings"] is True
