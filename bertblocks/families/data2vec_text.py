"""Data2VecText (``model_type: data2vec-text``): RoBERTa's modelling under ``data2vec_text.``.

transformers' ``Data2VecText*`` classes are RoBERTa's (post-LN layers, positions past the padding index, RoBERTa's
``lm_head`` and dense classifier); only the backbone's checkpoint prefix and the class names differ. The published
checkpoint (facebook/data2vec-text-base) uses RoBERTa's byte-level BPE vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.core.component import Component
from bertblocks.families.keymap import KeyMap

from . import roberta

#: Data2VecTextConfig's defaults where they differ from bertblocks' (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {"pad_token_id": 1}


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    return roberta.roberta_like_from_hf({**DEFAULTS, **hf})


DATA2VEC_TEXT = roberta.roberta_like(
    "data2vec-text",
    "Data2VecText",
    "Data2VecText: RoBERTa's modelling under data2vec_text.",
    key_map=KeyMap(prefix="data2vec_text", rules=roberta.LM_HEAD_RULES, head_prefixes=roberta.HEAD_PREFIXES),
    config_from_hf=_from_hf,
    # the published checkpoints name transformers' RobertaTokenizer: that family claims the class
    tokenizer=replace(roberta.roberta_tokenizer("Roberta"), tokenizer_classes=()),
)


def bertblocks_register_components() -> list[Component]:
    f = DATA2VEC_TEXT
    return [Component("family", f.model_type, lambda **_: f, description=f.description)]
