"""The BERT family (``model_type: bert``): config.json is read as it always was, the key map is the identity."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.core.family import BERT_TOKENIZER, Family
from bertblocks.core.keymap import KeyMap

from ._bertlike import BERT_ARCHITECTURES


def _from_hf(hf: Any) -> dict[str, Any]:
    return BertConfig.from_hf(hf).model_dump()


def _to_hf(config: BertConfig) -> dict[str, Any]:
    return config.to_hf()


BERT = Family(
    model_type="bert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    key_map=KeyMap(prefix="bert", head_prefixes=("cls.", "classifier.", "qa_outputs.")),
    architectures=BERT_ARCHITECTURES,
    base_architecture="BertModel",
    description="BERT (post-LN, learned absolute positions, token types)",
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=("BertTokenizer", "BertTokenizerFast")),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "bert", lambda **_: BERT, description=BERT.description)]
