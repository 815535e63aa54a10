"""RoBERTa and the families that share its modelling code in transformers: XLM-RoBERTa and CamemBERT.

What differs from BERT: positions start past the padding index and skip padding
(``embedding.position_offset: padding``), one token type, a gelu ``lm_head`` and a ``dense → tanh →
out_proj`` sequence classifier; the checkpoint prefix is ``roberta.``.
"""

from __future__ import annotations

from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import Family, TokenizerConvention
from bertblocks.families.keymap import KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf

#: RoBERTa's ``lm_head`` is BERT's ``cls.predictions`` under other names
LM_HEAD_RULES = (
    Rename("lm_head.dense", "cls.predictions.transform.dense"),
    Rename("lm_head.layer_norm", "cls.predictions.transform.LayerNorm"),
    Rename("lm_head.decoder", "cls.predictions.decoder"),
    Rename("lm_head.bias", "cls.predictions.bias"),
)
KEY_MAP = KeyMap(prefix="roberta", rules=LM_HEAD_RULES, head_prefixes=("lm_head.", "classifier.", "qa_outputs."))
FIXED = {"embedding.position_offset": "padding", "position.name": "absolute"}


def _from_hf(hf: Any) -> dict[str, Any]:
    data = bert_fields_from_hf(hf)
    # positions past the padding index: FIXED, which the translator applies
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    return bert_fields_to_hf(config, dropped=("position_embedding_type",))


def roberta_tokenizer(class_prefix: str) -> TokenizerConvention:
    """RoBERTa's framing: ``<s> A </s>`` and ``<s> A </s></s> B </s>``, one token type, none returned."""
    return TokenizerConvention(
        special_tokens={
            "unk_token": "<unk>",
            "sep_token": "</s>",
            "pad_token": "<pad>",
            "cls_token": "<s>",
            "mask_token": "<mask>",
        },
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        model_input_names=("input_ids", "attention_mask"),
        tokenizer_classes=(f"{class_prefix}Tokenizer", f"{class_prefix}TokenizerFast"),
    )


def roberta_like(model_type: str, class_prefix: str, description: str) -> Family:
    """A family with RoBERTa's modelling and checkpoint layout under transformers class names ``<prefix>For…``."""
    return Family(
        model_type=model_type,
        config_from_hf=_from_hf,
        config_to_hf=_to_hf,
        fields=BERT_FIELDS,
        key_map=KEY_MAP,
        architectures={
            f"{class_prefix}ForMaskedLM": "masked_lm_gelu",
            f"{class_prefix}ForCausalLM": "causal_lm_gelu",
            f"{class_prefix}ForSequenceClassification": {"name": "dense_classification", "activation": "tanh"},
            f"{class_prefix}ForTokenClassification": "token_classification",
            f"{class_prefix}ForQuestionAnswering": "question_answering",
            f"{class_prefix}ForMultipleChoice": "multiple_choice",
        },
        base_architecture=f"{class_prefix}Model",
        fixed=FIXED,
        description=description,
        tokenizer=roberta_tokenizer(class_prefix),
    )


ROBERTA = roberta_like("roberta", "Roberta", "RoBERTa: positions offset past padding, gelu LM head, dense classifier")
XLM_ROBERTA = roberta_like("xlm-roberta", "XLMRoberta", "XLM-RoBERTa: RoBERTa's modelling, a SentencePiece vocabulary")
CAMEMBERT = roberta_like("camembert", "Camembert", "CamemBERT: RoBERTa's modelling, a French SentencePiece vocabulary")


def bertblocks_register_components() -> list[Component]:
    return [
        Component("family", f.model_type, (lambda f=f, **_: f), description=f.description)
        for f in (ROBERTA, XLM_ROBERTA, CAMEMBERT)
    ]
