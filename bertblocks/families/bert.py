"""The BERT family (``model_type: bert``): config.json is transformers' ``BertConfig``, the key map the identity.

A family like the others: the one config.json translator (:mod:`bertblocks.hf.config_json`) reads and writes
it through :data:`BERT`, as it does RoBERTa or ModernBERT.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .family import BERT_TOKENIZER, Family
from .keymap import BACKBONE_PREFIX, KeyMap

#: transformers' BERT backbone class
BASE_ARCHITECTURE = "BertModel"
#: transformers' BERT task classes → the built-in head each means (the one table of them: task models and
#: ERNIE's classes read it too)
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


def config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A BERT ``config.json`` → a bertblocks config dict. An ``architectures`` entry that is neither BERT's
    backbone nor one of its task classes is kept in ``hf`` and written back."""
    data = bert_fields_from_hf(hf)
    architectures = hf.get("architectures")
    known = (BASE_ARCHITECTURE, *BERT_ARCHITECTURES)
    if architectures is not None and not (
        isinstance(architectures, list) and len(architectures) == 1 and architectures[0] in known
    ):
        data["hf"]["architectures"] = architectures
    return data


def config_to_hf(config: BertConfig) -> dict[str, Any]:
    """A config → transformers' ``BertConfig`` fields (a kept ``architectures`` entry included)."""
    out = bert_fields_to_hf(config)
    if "architectures" in config.hf:
        out["architectures"] = config.hf["architectures"]
    return out


BERT = Family(
    model_type="bert",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    fields=BERT_FIELDS,
    # bertblocks' keys are BERT's (a task model keeps its backbone under `bert.`, as BertFor… do): the identity
    key_map=KeyMap(prefix=BACKBONE_PREFIX, head_prefixes=("cls.", "classifier.", "qa_outputs.")),
    architectures=BERT_ARCHITECTURES,
    base_architecture=BASE_ARCHITECTURE,
    description="BERT (post-LN, learned absolute positions, token types)",
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=("BertTokenizer", "BertTokenizerFast")),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "bert", lambda **_: BERT, description=BERT.description)]
