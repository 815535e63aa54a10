"""XLM-RoBERTa-XL and -XXL (``model_type: xlm-roberta-xl``): RoBERTa with pre-LN layers and no embedding norm.

Composition: RoBERTa's (:func:`~bertblocks.families.roberta.roberta_like`: positions past the padding index, its
heads, XLM-R's SentencePiece tokenizer convention) with ``pre_ln`` layers and their final norm
(:mod:`bertblocks.families._pre_ln`), embeddings without a LayerNorm (``embedding.norm: false``: transformers'
``XLMRobertaXLEmbeddings`` deletes RoBERTa's), and no dropout after the feed-forward output projection
(``encoder.feedforward.output_dropout: false``: ``XLMRobertaXLOutput`` has none; the attention output keeps its own).

The checkpoint: prefix ``roberta.``; ``encoder.layer.{i}.attention.self_attn_layer_norm`` ↔ ``attention_norm``
(``crossattention.self_attn_layer_norm`` ↔ ``crossattention_norm``), ``encoder.layer.{i}.LayerNorm`` ↔
``feedforward_norm``, ``encoder.LayerNorm`` ↔ ``encoder.final_norm``; RoBERTa's ``lm_head``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.core.component import Component
from bertblocks.families.keymap import KeyMap

from . import roberta
from ._pre_ln import PreLNLayout

PREFIX = "roberta"
LAYOUT = PreLNLayout(
    attention_norm="self_attn_layer_norm",
    feedforward_norm="LayerNorm",
    final_norm="encoder.LayerNorm",
    embedding_norm=False,
)
#: XLMRobertaXLConfig's defaults where they differ from bertblocks' (a config.json without the field means these:
#: facebook/xlm-roberta-xl's dimensions)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 250880,
    "hidden_size": 2560,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "intermediate_size": 10240,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "pad_token_id": 1,
    "layer_norm_eps": 1e-5,
}
KEY_MAP = KeyMap(
    prefix=PREFIX, rules=(*LAYOUT.rules(PREFIX), *roberta.LM_HEAD_RULES), head_prefixes=roberta.HEAD_PREFIXES
)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    return roberta.roberta_like_from_hf({**DEFAULTS, **hf})


XLM_ROBERTA_XL = roberta.roberta_like(
    "xlm-roberta-xl",
    "XLMRobertaXL",
    "XLM-RoBERTa-XL/XXL: RoBERTa with pre-LN layers, a final norm and no embedding norm",
    key_map=KEY_MAP,
    fixed={**roberta.FIXED, **LAYOUT.fixed, "encoder.feedforward.output_dropout": False},
    config_from_hf=_from_hf,
    # the published checkpoints name transformers' XLMRobertaTokenizer: that family claims the class
    tokenizer=replace(roberta.roberta_tokenizer("XLMRoberta"), tokenizer_classes=()),
)


def bertblocks_register_components() -> list[Component]:
    f = XLM_ROBERTA_XL
    return [Component("family", f.model_type, lambda **_: f, description=f.description)]
