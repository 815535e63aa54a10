"""RoBERTa-PreLayerNorm (``model_type: roberta-prelayernorm``): RoBERTa with pre-LN layers.

Composition: RoBERTa's (:func:`~bertblocks.families.roberta.roberta_like`: positions past the padding index, the
embeddings' LayerNorm, its heads and tokenizer) with ``pre_ln`` layers and their final norm
(:mod:`bertblocks.families._pre_ln`). transformers' ``RobertaPreLayerNormModel`` applies that final norm on the
backbone, after its encoder: bertblocks' ``encoder.final_norm`` is the same step (the pooler reads its output).

The checkpoint: prefix ``roberta_prelayernorm.``; ``encoder.layer.{i}.attention.LayerNorm`` ↔ ``attention_norm``
(``crossattention.LayerNorm`` ↔ ``crossattention_norm``), ``encoder.layer.{i}.intermediate.LayerNorm`` ↔
``feedforward_norm``, ``LayerNorm`` ↔ ``encoder.final_norm``; RoBERTa's ``lm_head``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.core.component import Component
from bertblocks.families.keymap import KeyMap

from . import roberta
from ._pre_ln import PreLNLayout

PREFIX = "roberta_prelayernorm"
LAYOUT = PreLNLayout(
    attention_norm="LayerNorm", feedforward_norm="intermediate.LayerNorm", final_norm="LayerNorm", embedding_norm=True
)
#: RobertaPreLayerNormConfig's defaults where they differ from bertblocks' (a config.json without the field means
#: these)
DEFAULTS: dict[str, Any] = {"vocab_size": 50265, "pad_token_id": 1}
KEY_MAP = KeyMap(
    prefix=PREFIX, rules=(*LAYOUT.rules(PREFIX), *roberta.LM_HEAD_RULES), head_prefixes=roberta.HEAD_PREFIXES
)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    return roberta.roberta_like_from_hf({**DEFAULTS, **hf})


ROBERTA_PRELAYERNORM = roberta.roberta_like(
    "roberta-prelayernorm",
    "RobertaPreLayerNorm",
    "RoBERTa-PreLayerNorm: RoBERTa with pre-LN layers and a final norm",
    key_map=KEY_MAP,
    fixed={**roberta.FIXED, **LAYOUT.fixed},
    config_from_hf=_from_hf,
    # the published checkpoints name transformers' RobertaTokenizer: that family claims the class
    tokenizer=replace(roberta.roberta_tokenizer("Roberta"), tokenizer_classes=()),
)


def bertblocks_register_components() -> list[Component]:
    f = ROBERTA_PRELAYERNORM
    return [Component("family", f.model_type, lambda **_: f, description=f.description)]
