"""Shared by the families whose config.json is BERT's with other defaults and extras (RoBERTa, ELECTRA, ERNIE):
read and write the common fields the way BERT's are read and written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.core.config import BertConfig

#: transformers' task-model suffixes for the BERT-shaped heads, with the head each means
BERT_SHAPED_HEADS: dict[str, str] = {
    "ForTokenClassification": "token_classification",
    "ForQuestionAnswering": "question_answering",
}


def bert_fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The BERT fields of a BERT-like ``config.json`` as a bertblocks config dict; other fields stay in ``hf``.

    ``architectures`` is left to the caller (the family's class names differ from BERT's).
    """
    src = {k: v for k, v in hf.items() if k != "architectures"}
    src["model_type"] = "bert"
    return BertConfig.from_hf(src).model_dump(exclude={"family"})


def bert_fields_to_hf(config: BertConfig, dropped: tuple[str, ...] = ()) -> dict[str, Any]:
    """The BERT fields of ``config`` under HF's flat names, minus ``dropped`` (fields the family lacks)."""
    out = config.hf_fields()
    for key in dropped:
        out.pop(key, None)
    return out
