"""LayoutLM v1 (``model_type: layoutlm``): BERT plus 2-D position embeddings of each token's box on the page.

What differs from BERT: the embedding adds ``x``/``y`` tables at a box's corners and ``h``/``w`` tables at its height
and width (``embedding.box_positions``, config.json's ``max_2d_position_embeddings``), read from a ``bbox`` input
``[b, q, 4]`` the model takes beside ``input_ids`` (zeros when omitted, as transformers'); the checkpoint prefix is
``layoutlm.``; and transformers' task classes all build their backbone *with* its pooler (``pooler.always``), so a
token-classification checkpoint holds ``layoutlm.pooler`` too. The heads are BERT's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component

from .bertlike import BERT_FIELDS, POSITION_FIELD, bert_fields_from_hf, bert_fields_to_hf
from .family import BERT_TOKENIZER, Family
from .fields import HFField
from .keymap import KeyMap

#: config.json's size of the 2-D position tables (LayoutLMConfig's default)
BOX_FIELD = "max_2d_position_embeddings"
BOX_DEFAULT = 1024

#: LayoutLMConfig's fields: BERT's and the 2-D table size
FIELDS = {**BERT_FIELDS, BOX_FIELD: HFField(int, ge=1, doc="size of the x, y, h and w tables (box coordinates < it)")}


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = dict(hf)
    box = src.pop(BOX_FIELD, BOX_DEFAULT)
    data = bert_fields_from_hf(src)
    data["embedding"] = {**data["embedding"], "box_positions": box}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    # LayoutLMConfig has no position_embedding_type: its positions are absolute (fixed below)
    out = bert_fields_to_hf(config, dropped=(POSITION_FIELD,))
    box = config.embedding.options().get("box_positions")
    if box is not None:
        out[BOX_FIELD] = box
    return out


LAYOUTLM = Family(
    model_type="layoutlm",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KeyMap(prefix="layoutlm", head_prefixes=("cls.", "classifier.", "qa_outputs.")),
    architectures={
        "LayoutLMForMaskedLM": "masked_lm",
        "LayoutLMForSequenceClassification": "sequence_classification",
        "LayoutLMForTokenClassification": "token_classification",
        "LayoutLMForQuestionAnswering": "question_answering",
    },
    base_architecture="LayoutLMModel",
    fixed={"position.name": "absolute", "embedding.name": "bert", "pooler.always": True},
    description="LayoutLM: BERT plus 2-D position embeddings of each token's box (a bbox input)",
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=("LayoutLMTokenizer", "LayoutLMTokenizerFast")),
    example_config={"hidden_size": 32, "num_attention_heads": 4, BOX_FIELD: 64},
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "layoutlm", lambda **_: LAYOUTLM, description=LAYOUTLM.description)]
