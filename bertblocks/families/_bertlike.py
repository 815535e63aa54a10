"""Shared by the families whose config.json is BERT's with other defaults and extras (RoBERTa, ELECTRA, ERNIE):
read and write the common fields the way BERT's are read and written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig

#: transformers' BERT task classes → the built-in head each means
BERT_ARCHITECTURES: dict[str, str] = {
    "BertForMaskedLM": "masked_lm",
    "BertForNextSentencePrediction": "next_sentence",
    "BertForPreTraining": "pretraining",
    "BertLMHeadModel": "causal_lm",
    "BertForSequenceClassification": "sequence_classification",
    "BertForTokenClassification": "token_classification",
    "BertForQuestionAnswering": "question_answering",
    "BertForMultipleChoice": "multiple_choice",
}
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
    """The BERT fields of ``config`` under HF's flat names, minus ``dropped`` (fields the family lacks).

    ``model_type``, ``architectures`` and the ``bertblocks`` block are left to the caller, which knows the family.
    """
    out = config.model_copy(update={"head": None, "family": "bert"}).to_hf()
    for key in ("model_type", "architectures", "bertblocks", *dropped):
        out.pop(key, None)
    return out
