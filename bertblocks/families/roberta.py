"""RoBERTa and the families that share its modelling code in transformers: XLM-RoBERTa and CamemBERT.

What differs from BERT: positions start past the padding index and skip padding
(``embedding.position_offset: padding``), one token type, a gelu ``lm_head`` and a ``dense → tanh →
out_proj`` sequence classifier; the checkpoint prefix is ``roberta.``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import Family, TokenizerConvention
from bertblocks.families.keymap import KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .fields import HFField

#: RoBERTa's ``lm_head`` is BERT's ``cls.predictions`` under other names
LM_HEAD_RULES = (
    Rename("lm_head.dense", "cls.predictions.transform.dense"),
    Rename("lm_head.layer_norm", "cls.predictions.transform.LayerNorm"),
    Rename("lm_head.decoder", "cls.predictions.decoder"),
    Rename("lm_head.bias", "cls.predictions.bias"),
)
#: the top-level checkpoint prefixes of RoBERTa's heads
HEAD_PREFIXES = ("lm_head.", "classifier.", "qa_outputs.")
KEY_MAP = KeyMap(prefix="roberta", rules=LM_HEAD_RULES, head_prefixes=HEAD_PREFIXES)
FIXED = {"embedding.position_offset": "padding", "position.name": "absolute"}


def roberta_like_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A RoBERTa-shaped ``config.json`` → a config dict: BERT's fields, positions past the padding index."""
    data = bert_fields_from_hf(hf)
    # positions past the padding index: FIXED, which the translator applies
    return data


def roberta_like_to_hf(config: BertConfig) -> dict[str, Any]:
    """A config → RoBERTa's ``config.json`` fields (BERT's, without ``position_embedding_type``)."""
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


def roberta_like(
    model_type: str,
    class_prefix: str,
    description: str,
    *,
    key_map: KeyMap = KEY_MAP,
    fixed: Mapping[str, Any] = FIXED,
    config_from_hf: Callable[[Mapping[str, Any]], dict[str, Any]] = roberta_like_from_hf,
    config_to_hf: Callable[[BertConfig], dict[str, Any]] = roberta_like_to_hf,
    fields: Mapping[str, HFField] = BERT_FIELDS,
    tokenizer: TokenizerConvention | None = None,
) -> Family:
    """A family with RoBERTa's heads and tokenizer under transformers class names ``<prefix>For…``: RoBERTa's
    modelling and checkpoint layout, or (the keyword arguments) a variant's (RoBERTa-PreLayerNorm's pre-LN layers
    under ``roberta_prelayernorm.``, Data2VecText's prefix ``data2vec_text.``; ``tokenizer``: the convention, when
    the family's checkpoints use another family's tokenizer class)."""
    return Family(
        model_type=model_type,
        config_from_hf=config_from_hf,
        config_to_hf=config_to_hf,
        fields=fields,
        key_map=key_map,
        architectures={
            f"{class_prefix}ForMaskedLM": "masked_lm_gelu",
            f"{class_prefix}ForCausalLM": "causal_lm_gelu",
            f"{class_prefix}ForSequenceClassification": {"name": "dense_classification", "activation": "tanh"},
            f"{class_prefix}ForTokenClassification": "token_classification",
            f"{class_prefix}ForQuestionAnswering": "question_answering",
            f"{class_prefix}ForMultipleChoice": "multiple_choice",
        },
        base_architecture=f"{class_prefix}Model",
        fixed=fixed,
        description=description,
        tokenizer=tokenizer or roberta_tokenizer(class_prefix),
    )


ROBERTA = roberta_like("roberta", "Roberta", "RoBERTa: positions offset past padding, gelu LM head, dense classifier")
XLM_ROBERTA = roberta_like("xlm-roberta", "XLMRoberta", "XLM-RoBERTa: RoBERTa's modelling, a SentencePiece vocabulary")
CAMEMBERT = roberta_like("camembert", "Camembert", "CamemBERT: RoBERTa's modelling, a French SentencePiece vocabulary")


def bertblocks_register_components() -> list[Component]:
    return [
        Component("family", f.model_type, (lambda f=f, **_: f), description=f.description)
        for f in (ROBERTA, XLM_ROBERTA, CAMEMBERT)
    ]
