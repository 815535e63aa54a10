"""Jina-embeddings-v3 (``model_type: jina_embeddings_v3``), what only this family does: its config.json maps to
rotary positions without RoBERTa's position offset, a fused QKV projection and BERT's feed-forward, and its class
defaults fill a sparse config.json. Parity of every head, the padded and packed paths, hidden states, attention
probabilities, in-memory checkpoint names, the errors, the tokenizer convention and the preset: the tables of
``test_parity.py``."""

from __future__ import annotations

import transformers

import bertblocks
from bertblocks.hf.config_json import config_from_hf, config_to_hf

from .reference import FAMILIES

JINA = FAMILIES["jina_embeddings_v3"]


def test_config_maps_to_the_components_it_is_made_of():
    cfg = bertblocks.load_config(config_from_hf(JINA.hf_config()))
    assert cfg.position.name == "rope"
    assert cfg.position.options()["base"] == 30.0
    assert cfg.embedding.options().get("position_offset", "none") == "none"  # no RoBERTa offset: 0, 1, 2, …
    assert cfg.encoder.attention.options()["fused_qkv"] is True
    assert cfg.encoder.feedforward.name == "bert"
    assert cfg.pooler is not None  # JinaEmbeddingsV3Model has one
    back = config_to_hf(cfg)
    assert back["rope_parameters"] == {"rope_theta": 30.0, "rope_type": "default"}
    assert "bertblocks" not in back


def test_class_defaults_fill_a_sparse_config_json():
    cfg = bertblocks.load_config(config_from_hf({"model_type": "jina_embeddings_v3"}))
    theirs = transformers.JinaEmbeddingsV3Config()
    assert cfg.vocab_size == theirs.vocab_size
    assert cfg.hidden_size == theirs.hidden_size
    assert cfg.encoder.num_layers == theirs.num_hidden_layers
    assert cfg.pad_token_id == theirs.pad_token_id
    assert cfg.layer_norm_eps == theirs.layer_norm_eps
    assert cfg.position.options()["base"] == theirs.rope_parameters["rope_theta"]
