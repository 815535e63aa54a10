"""ConvBERT (``model_type: convbert``): BERT's post-LN layers with ConvBERT's mixed attention, grouped feed-forward
projections, and ELECTRA's embedding width and heads.

* attention: the built-in ``convbert`` attention (:mod:`bertblocks.plugins.mixed_attention`): ``num_attention_heads
  // head_ratio`` softmax heads beside as many span-based dynamic convolution heads of width ``conv_kernel_size``;
* feed-forward: BERT's, with ``num_groups`` grouped projections (``encoder.feedforward.groups``);
* embeddings of ``embedding_size``, projected to the hidden size by ``embeddings_project`` when the two differ;
* no pooler; the masked LM is ELECTRA's generator head (``dense → gelu → LayerNorm`` at ``embedding_size``, the
  decoder tied to the token embeddings), sequence classification RoBERTa's ``dense → hidden_act → out_proj`` on the
  first token, multiple choice each choice's *last* position (``ConvBertSequenceSummary`` as ConvBertConfig leaves
  it: ``summary_type`` last, no projection), as RoFormer's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component

from ..errors import InputError
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf, default
from .family import BERT_TOKENIZER, Family
from .fields import HFField
from .keymap import KeyMap, Rename

#: ConvBertConfig's defaults where they differ from BERT's (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {"pad_token_id": 1}
#: ConvBertConfig's defaults of its own fields
HEAD_RATIO = 2
CONV_KERNEL_SIZE = 9
NUM_GROUPS = 1
#: what ConvBertSequenceSummary reads from the config when a file has the field (ConvBertConfig has none of them):
#: the values that give bertblocks' last-position head, the only one a ConvBERT model uses
SUMMARY_DEFAULTS: dict[str, Any] = {"summary_type": "last", "summary_use_proj": False, "summary_activation": None}

KEY_MAP = KeyMap(
    prefix="convbert",
    rules=(
        Rename("convbert.embeddings_project", "bert.embeddings.projection"),
        Rename("generator_predictions.dense", "cls.predictions.transform.dense"),
        Rename("generator_predictions.LayerNorm", "cls.predictions.transform.LayerNorm"),
        Rename("generator_lm_head.weight", "cls.predictions.decoder.weight"),
        Rename("generator_lm_head.bias", "cls.predictions.bias"),
    ),
    head_prefixes=("generator_predictions.", "generator_lm_head.", "classifier.", "qa_outputs.", "sequence_summary."),
)

#: tied output embeddings: the format stores one decoder bias (generator_lm_head.bias), which bertblocks' tied LM
#: head holds; an untied head's own decoder bias has no key in it (every published ConvBERT is tied)
FIXED: dict[str, Any] = {
    "position.name": "absolute",
    "encoder.attention.name": "convbert",
    "pooler": None,
    "tie_word_embeddings": True,
}


def _from_hf(hf: Any) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    embedding_size = src.pop("embedding_size", None)
    attention = {  # the attention's name (convbert) and no pooler are FIXED, applied by the translator
        "head_ratio": src.pop("head_ratio", HEAD_RATIO),
        "conv_kernel_size": src.pop("conv_kernel_size", CONV_KERNEL_SIZE),
    }
    groups = src.pop("num_groups", NUM_GROUPS)
    for key, expected in SUMMARY_DEFAULTS.items():
        if src.get(key, expected) != expected:
            raise InputError(
                f"{key} is {src[key]!r}; bertblocks' ConvBERT multiple-choice head is ConvBertConfig's "
                f"(summary_type 'last', no projection, no activation), which needs {expected!r}"
            )
    data = bert_fields_from_hf(src)
    data["encoder"]["attention"].update(attention)
    data["encoder"]["feedforward"]["groups"] = groups
    hidden = data.get("hidden_size", default("hidden_size"))
    if embedding_size is not None and embedding_size != hidden:  # ConvBertModel projects only then
        data["embedding"] = {**data["embedding"], "embedding_size": embedding_size}
    if (hf.get("architectures") or []) == ["ConvBertForMaskedLM"]:
        data["head"] = {"name": "masked_lm_gelu", "embedding_size": embedding_size}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    out["embedding_size"] = config.embedding.options().get("embedding_size") or config.hidden_size
    if config.encoder.attention.name != "convbert":
        raise InputError(
            f"a convbert config.json describes the convbert attention; encoder.attention.name is "
            f"{config.encoder.attention.name!r}"
        )
    attention = config.encoder.attention.options()
    out["head_ratio"] = attention["head_ratio"]
    out["conv_kernel_size"] = attention["conv_kernel_size"]
    out["num_groups"] = config.encoder.feedforward.options().get("groups", NUM_GROUPS)
    return out


#: ConvBertConfig's fields: BERT's, the embedding width, the mixed attention's and the grouped feed-forward's, and
#: the sequence-summary fields its multiple-choice head reads when a file has them
FIELDS = {
    **BERT_FIELDS,
    "embedding_size": HFField(int, ge=1, nullable=True),
    "head_ratio": HFField(int, ge=1),
    "conv_kernel_size": HFField(int, ge=1),
    "num_groups": HFField(int, ge=1),
    "summary_type": HFField(str),
    "summary_use_proj": HFField(bool),
    "summary_activation": HFField(str, nullable=True),
}

CONVBERT = Family(
    model_type="convbert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    example_config={
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 38,
        "vocab_size": 99,
        "embedding_size": 16,
        "conv_kernel_size": 3,
        "num_groups": 2,
    },
    key_map=KEY_MAP,
    architectures={
        "ConvBertForMaskedLM": "masked_lm_gelu",
        "ConvBertForSequenceClassification": {"name": "dense_classification", "activation": "hidden_act"},
        "ConvBertForTokenClassification": "token_classification",
        "ConvBertForQuestionAnswering": "question_answering",
        "ConvBertForMultipleChoice": "last_position_multiple_choice",
    },
    base_architecture="ConvBertModel",
    fixed=FIXED,
    description="ConvBERT: mixed attention (softmax heads + span-based dynamic convolution heads), grouped FFN",
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=("ConvBertTokenizer", "ConvBertTokenizerFast")),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "convbert", lambda **_: CONVBERT, description=CONVBERT.description)]
