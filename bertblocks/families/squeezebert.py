"""SqueezeBERT (``model_type: squeezebert``): BERT with every projection a grouped pointwise convolution.

The attention and feed-forward are the built-in ``grouped_conv`` components (:mod:`bertblocks.plugins.grouped_conv`:
``q_groups``, ``k_groups``, ``v_groups``, ``post_attention_groups``, ``intermediate_groups``, ``output_groups``);
the embeddings, post-LN layer, pooler and heads are BERT's. Every transformers task class keeps the backbone's
pooler (``pooler.always``). transformers' ``output_attentions`` returns the pre-softmax *scores*, bertblocks
the probabilities, as every other family.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component

from ..errors import InputError
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .family import BERT_TOKENIZER, Family
from .fields import HFField
from .keymap import KeyMap, Rename

#: SqueezeBertConfig's group fields and defaults: (config.json field, the component's option)
ATTENTION_GROUPS = {"q_groups": "q_groups", "k_groups": "k_groups", "v_groups": "v_groups"}
ATTENTION_GROUPS["post_attention_groups"] = "output_groups"
FEEDFORWARD_GROUPS = {"intermediate_groups": "intermediate_groups", "output_groups": "output_groups"}
DEFAULT_GROUPS = {"q_groups": 4, "k_groups": 4, "v_groups": 4, "post_attention_groups": 1}
DEFAULT_GROUPS.update({"intermediate_groups": 4, "output_groups": 4})

_L = "transformer.encoder.layers.{i}"
_B = "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="transformer",
    rules=(
        Rename(f"{_L}.attention.query", f"{_B}.attention.self.query"),
        Rename(f"{_L}.attention.key", f"{_B}.attention.self.key"),
        Rename(f"{_L}.attention.value", f"{_B}.attention.self.value"),
        Rename(f"{_L}.post_attention.conv1d", f"{_B}.attention.output.dense"),
        Rename(f"{_L}.post_attention.layernorm", f"{_B}.attention.output.LayerNorm"),
        Rename(f"{_L}.intermediate.conv1d", f"{_B}.intermediate.dense"),
        Rename(f"{_L}.output.conv1d", f"{_B}.output.dense"),
        Rename(f"{_L}.output.layernorm", f"{_B}.output.LayerNorm"),
    ),
    head_prefixes=("cls.", "classifier.", "qa_outputs."),
)

FIXED: dict[str, Any] = {
    "position.name": "absolute",
    "encoder.attention.name": "grouped_conv",
    "encoder.feedforward.name": "grouped_conv",
    "pooler.always": True,  # transformers' task classes all keep the pooler
}


def _from_hf(hf: Any) -> dict[str, Any]:
    src = dict(hf)
    groups = {name: src.pop(name, default) for name, default in DEFAULT_GROUPS.items()}
    embedding_size = src.pop("embedding_size", None)
    hidden = src.get("hidden_size", 768)
    if embedding_size is not None and embedding_size != hidden:
        # transformers' SqueezeBertEncoder asserts the two are equal (it has no projection)
        raise InputError(f"embedding_size {embedding_size} must equal hidden_size {hidden} (SqueezeBERT projects none)")
    # SqueezeBertConfig has no classifier_dropout: its classifiers drop hidden_dropout_prob (kept, unused)
    unused = {k: src.pop(k) for k in ("classifier_dropout",) if k in src}
    data = bert_fields_from_hf(src)
    data["hf"].update(unused)
    data["encoder"]["attention"].update(
        {option: groups[field] for field, option in ATTENTION_GROUPS.items()}  # the name: FIXED
    )
    data["encoder"]["feedforward"].update({option: groups[field] for field, option in FEEDFORWARD_GROUPS.items()})
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type", "classifier_dropout"))
    if "classifier_dropout" in config.hf:
        out["classifier_dropout"] = config.hf["classifier_dropout"]
    attention, feedforward = config.encoder.attention, config.encoder.feedforward
    if attention.name != "grouped_conv" or feedforward.name != "grouped_conv":
        raise InputError(
            "a squeezebert config.json describes the grouped_conv attention and feed-forward; encoder.attention.name "
            f"is {attention.name!r} and encoder.feedforward.name {feedforward.name!r}"
        )
    out.update({field: attention.options()[option] for field, option in ATTENTION_GROUPS.items()})
    out.update({field: feedforward.options()[option] for field, option in FEEDFORWARD_GROUPS.items()})
    out["embedding_size"] = config.hidden_size
    return out


#: SqueezeBertConfig's fields: BERT's, the embedding width (the hidden size) and the six group counts
FIELDS = {
    **BERT_FIELDS,
    "embedding_size": HFField(int, ge=1),
    **{name: HFField(int, ge=1) for name in DEFAULT_GROUPS},
}

SQUEEZEBERT = Family(
    model_type="squeezebert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    example_config={
        "hidden_size": 32,
        "embedding_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "vocab_size": 99,
    },
    key_map=KEY_MAP,
    architectures={
        "SqueezeBertForMaskedLM": "masked_lm",
        "SqueezeBertForSequenceClassification": "sequence_classification",
        "SqueezeBertForTokenClassification": "token_classification",
        "SqueezeBertForQuestionAnswering": "question_answering",
        "SqueezeBertForMultipleChoice": "multiple_choice",
    },
    base_architecture="SqueezeBertModel",
    fixed=FIXED,
    description="SqueezeBERT: BERT with grouped pointwise-convolution projections (grouped_conv attention and FFN)",
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=("SqueezeBertTokenizer", "SqueezeBertTokenizerFast")),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "squeezebert", lambda **_: SQUEEZEBERT, description=SQUEEZEBERT.description)]
