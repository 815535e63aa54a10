"""DeBERTa v1 (``model_type: deberta``): BERT's post-LN layers with disentangled attention, v1's layout.

The same components as DeBERTa-v2 (:mod:`.deberta_v2`), with v1's choices:

* position ``disentangled`` (:mod:`bertblocks.plugins.disentangled`) without log buckets (``position_buckets:
  -1``: a distance reads its own row, clamped at ``max_relative_positions``, which ``-1`` makes
  ``max_position_embeddings``), without a LayerNorm on the shared table ``encoder.rel_embeddings``, and with each
  layer's own position projections (``share_att_key: false``): ``pos_proj`` (the c2p term's keys, no bias) and
  ``pos_q_proj`` (the p2c term's queries, with a bias); ``pos_att_type`` a list or the string ``"c2p|p2c"``;
  ``position_biased_input`` (BERT's absolute table too; true by default, false in the published checkpoints);
* attention ``bert`` with one bias-free projection fused per head (``in_proj``: each head's query, key and value
  rows; ``fused_qkv``, ``qkv_layout: heads``) and biases for the query and the value alone (``q_bias``,
  ``v_bias``; ``qv_bias``);
* DeBERTa's LayerNorm (``DebertaLayerNorm``: float32 statistics, epsilon inside the root) is ``nn.LayerNorm``'s
  computation under the same ``LayerNorm`` keys: the same numbers in float32;
* no pooler in the backbone; the sequence classifier has the ``context_pooler`` (``pooler_hidden_act``); the
  masked LM is BERT's ``cls.predictions`` (``legacy: true``), and the ``lm_predictions.lm_head`` layout of
  ``legacy: false`` loads into it, as in DeBERTa-v2.

The checkpoint: prefix ``deberta.``; ``attention.self.in_proj`` ↔ ``attention.self.Wqkv``; ``attention.self.pos_proj``
/ ``pos_q_proj`` ↔ ``attention.self.disentangled.pos_key_proj`` / ``pos_query_proj``; the classifier's
``pooler.dense`` is the backbone's ``pooler.dense``. The absolute table transformers stores but never reads when
``position_biased_input`` is false (microsoft/deberta-base has it) is dropped on load, as transformers drops it.

Refused, naming the field: ``talking_head: true`` (the head-mixing projections are not implemented),
``embedding_size`` other than ``hidden_size`` (v1 projects before its LayerNorm: not implemented),
``pooler_hidden_size`` other than ``hidden_size``, ``pooler_dropout`` other than 0 and ``pos_att_type`` other than
``c2p`` / ``p2c``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.keymap import KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .deberta_v2 import (
    MASKED_LM_RULES,
    DebertaConfigError,
    _refuse,
    _terms,
    context_pooler_from_hf,
    context_pooler_to_hf,
)
from .fields import HFField

MODEL_TYPE = "deberta"
#: transformers' task classes whose model has a ContextPooler (the backbone has none)
_POOLED = ("DebertaForSequenceClassification",)
#: DebertaConfig's defaults where they differ from BERT's (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {"vocab_size": 50265, "type_vocab_size": 0, "layer_norm_eps": 1e-7}

_L, _O = "deberta.encoder.layer.{i}.attention.self", "bert.encoder.layer.{i}.attention.self"
KEY_MAP = KeyMap(
    prefix="deberta",
    rules=(
        Rename(f"{_L}.in_proj", f"{_O}.Wqkv"),
        Rename(f"{_L}.pos_proj", f"{_O}.disentangled.pos_key_proj"),
        Rename(f"{_L}.pos_q_proj", f"{_O}.disentangled.pos_query_proj"),
        Rename("pooler.dense", "bert.pooler.dense"),
        *MASKED_LM_RULES,
    ),
    head_prefixes=("cls.", "classifier.", "qa_outputs.", "pooler.", "lm_predictions.", "mask_predictions."),
)

FIXED: dict[str, Any] = {
    "position.name": "disentangled",
    "position.position_buckets": -1,
    "position.norm": False,
    "position.share_att_key": False,
    "position.pos_key_bias": False,
    "encoder.attention.name": "bert",
    "encoder.attention.fused_qkv": True,
    "encoder.attention.qkv_layout": "heads",
    "encoder.attention.qkv_bias": False,
    "encoder.attention.qv_bias": True,
    "is_decoder": False,
    "add_cross_attention": False,
}


def _refuse_v1(field: str, value: Any, why: str) -> DebertaConfigError:
    return _refuse(field, value, why, MODEL_TYPE)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    hidden = src.get("hidden_size", 768)
    # FIELDS types every field read here (the translator checks them first)
    if src.pop("talking_head", False):
        raise _refuse_v1("talking_head", True, "the head-mixing projections (head_logits_proj) are not implemented")
    embedding_size = src.pop("embedding_size", hidden)
    if embedding_size != hidden:
        raise _refuse_v1(
            "embedding_size",
            embedding_size,
            f"the projection before the LayerNorm is not implemented (hidden {hidden})",
        )
    pooler, kept = context_pooler_from_hf(src, hf, _POOLED, MODEL_TYPE)
    # legacy: false names the masked LM's weights `lm_predictions.lm_head.*`: read into the same head, saved legacy
    src.pop("legacy", None)
    terms = _terms(src.pop("pos_att_type", None), MODEL_TYPE)
    for absent in ("use_cache", "is_decoder", "add_cross_attention"):  # DebertaConfig has none of them
        src.pop(absent, None)
    relative = src.pop("relative_attention", False)
    # the scheme's name, no log buckets, no table norm, each layer's own pos_proj (no bias) / pos_q_proj, and the
    # fused per-head in_proj with q_bias / v_bias come from FIXED (applied by the translator)
    position = {
        "max_relative_positions": src.pop("max_relative_positions", -1),
        "terms": terms,
        "absolute": src.pop("position_biased_input", True),
        "relative": relative,
    }
    data = bert_fields_from_hf(src)
    data["position"] = position
    data["pooler"] = pooler  # the sequence classifier's ContextPooler
    data["hf"].update(kept)
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    dropped = ("position_embedding_type", "use_cache", "is_decoder", "add_cross_attention", "classifier_dropout")
    out = bert_fields_to_hf(config, dropped=dropped)
    o = config.position.options()
    if config.encoder.layer.name != "post_ln":
        raise DebertaConfigError(
            f"encoder.layer {config.encoder.layer.name!r}: a deberta config.json has post-LN layers only"
        )
    out.update(
        relative_attention=o.get("relative", True),
        max_relative_positions=o.get("max_relative_positions", -1),
        # no term is DebertaConfig's default None (an empty list reads the same)
        pos_att_type=list(o.get("terms", ("p2c", "c2p"))) or None,
        position_biased_input=o.get("absolute", False),
        **context_pooler_to_hf(config),
    )
    return out


# transformers' DebertaTokenizer: byte-level BPE with BERT's special tokens; a pair is framed as RoBERTa frames it
# ([SEP] [SEP] between the texts), every token of token type 0
DEBERTA_TOKENIZER = dataclasses.replace(
    BERT_TOKENIZER,
    pair="[CLS] $A [SEP] [SEP] $B [SEP]",
    tokenizer_classes=("DebertaTokenizer", "DebertaTokenizerFast"),
)

#: DebertaConfig's fields: BERT's, the disentangled attention's, the context pooler's
FIELDS = {
    **BERT_FIELDS,
    "relative_attention": HFField(bool),
    "max_relative_positions": HFField(int, ge=-1, nullable=True, doc="< 1: max_position_embeddings"),
    "pos_att_type": HFField((list, str), items=str, nullable=True, doc='a list, or "c2p|p2c"'),
    "position_biased_input": HFField(bool),
    "talking_head": HFField(bool, doc="true is refused (not implemented)"),
    "embedding_size": HFField(int, ge=1),
    "pooler_hidden_size": HFField(int, ge=1),
    "pooler_dropout": HFField(float, ge=0, le=1),
    "pooler_hidden_act": HFField(str),
    "cls_dropout": HFField(float, ge=0, le=1, nullable=True),
    "legacy": HFField(bool),
}

DEBERTA = Family(
    model_type=MODEL_TYPE,
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "DebertaForMaskedLM": "masked_lm",
        "DebertaForSequenceClassification": "sequence_classification",
        "DebertaForTokenClassification": "token_classification",
        "DebertaForQuestionAnswering": "question_answering",
    },
    base_architecture="DebertaModel",
    fixed=FIXED,
    description="DeBERTa v1: disentangled attention (c2p|p2c) over an unbucketed relative table, per-head fused qkv",
    tokenizer=DEBERTA_TOKENIZER,
    example_config={"relative_attention": True, "pos_att_type": "c2p|p2c", "position_biased_input": False},
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", MODEL_TYPE, lambda **_: DEBERTA, description=DEBERTA.description)]
