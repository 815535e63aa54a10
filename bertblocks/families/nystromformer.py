"""Nyströmformer (transformers' ``nystromformer``): BERT's post-LN layers with the ``nystrom`` attention in every layer.

What differs from BERT: each layer's self-attention is Nyströmformer's (:mod:`bertblocks.plugins.nystrom`: full
softmax attention when ``num_landmarks == segment_means_seq_len``, as the published ``uw-madison/nystromformer-512``
has it, else segment-mean landmarks with an iterative pseudo-inverse; a depthwise ``conv_kernel_size`` convolution of
the values in both); default position ids start at 2 (``arange(L) + 2`` into a table of ``max_position_embeddings +
2`` rows: bertblocks' ``max_position_embeddings`` counts the rows); no pooler; the checkpoint prefix is
``nystromformer.``; the sequence classifier is RoBERTa's ``dense → hidden_act → out_proj``; multiple choice is
``pre_classifier → relu → classifier`` (transformers applies no dropout there; bertblocks' head applies the classifier
dropout in training).

``inv_coeff_init_option: true`` is refused: transformers' model cannot be built with it (its code reads
``config["inv_init_coeff_option"]``, a config is no mapping), so no checkpoint has it; the ``nystrom`` attention
itself offers it (``inv_coeff_init_option``) for configs of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf

ATTENTION = "nystrom"
#: transformers' position ids are ``arange(L) + 2``; its table has ``max_position_embeddings + 2`` rows
POSITION_START = 2
#: NystromformerConfig's defaults where they differ from BERT's: what a config.json without the field means
DEFAULTS: dict[str, Any] = {
    "vocab_size": 30000,
    "hidden_act": "gelu_new",
    "max_position_embeddings": 510,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "segment_means_seq_len": 64,
    "num_landmarks": 64,
    "conv_kernel_size": 65,
    "inv_coeff_init_option": False,
}
#: the attention's options, under the same names in config.json
ATTENTION_FIELDS = ("num_landmarks", "segment_means_seq_len", "conv_kernel_size")


class NystromformerConfigError(BertBlocksError, ValueError):
    """A Nyströmformer config.json field bertblocks cannot build."""


def nystromformer_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    if src.pop("inv_coeff_init_option"):
        raise NystromformerConfigError(
            "inv_coeff_init_option=True is not supported: transformers' Nystromformer cannot be built with it (its "
            "code reads config['inv_init_coeff_option']), so no checkpoint has it"
        )
    attention = {name: src.pop(name) for name in ATTENTION_FIELDS}
    src["max_position_embeddings"] = src["max_position_embeddings"] + POSITION_START
    data = bert_fields_from_hf(src)
    encoder = data.setdefault("encoder", {})
    # the attention's name is Family.fixed (the translator fills it in); its options are the file's
    encoder["attention"] = {**encoder.get("attention", {}), **attention}
    return data


def nystromformer_to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    out["max_position_embeddings"] = config.max_position_embeddings - POSITION_START
    # a layer without the nystrom attention (or other options) makes the file mean another model: the translation's
    # contradiction check refuses the save, naming the field
    options = config.encoder.attention.options()
    for name in ATTENTION_FIELDS:
        out[name] = options.get(name, DEFAULTS[name])
    out["inv_coeff_init_option"] = options.get("inv_coeff_init_option", False)
    return out


#: every config.json field nystromformer_from_hf reads: BERT's and the attention's
FIELDS = {
    **BERT_FIELDS,
    "segment_means_seq_len": HFField(int, ge=1, doc="equal to num_landmarks: full attention; else landmarks"),
    "num_landmarks": HFField(int, ge=1, doc="segment-mean landmarks of the queries and keys"),
    "conv_kernel_size": HFField(int, ge=1, doc="odd width of the depthwise convolution of the values"),
    "inv_coeff_init_option": HFField(bool, doc="the pseudo-inverse's exact start (refused: transformers fails)"),
}

KEY_MAP = KeyMap(
    prefix="nystromformer",
    rules=(
        Rename("pre_classifier", "classifier.dense", heads=("dense_multiple_choice",)),
        Rename("classifier", "classifier.out_proj", heads=("dense_multiple_choice",)),
    ),
    head_prefixes=("cls.", "classifier.", "pre_classifier.", "qa_outputs."),
)

NYSTROMFORMER = Family(
    model_type="nystromformer",
    config_from_hf=nystromformer_from_hf,
    config_to_hf=nystromformer_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "NystromformerForMaskedLM": "masked_lm",
        "NystromformerForSequenceClassification": {"name": "dense_classification", "activation": "hidden_act"},
        "NystromformerForTokenClassification": "token_classification",
        "NystromformerForQuestionAnswering": "question_answering",
        "NystromformerForMultipleChoice": {"name": "dense_multiple_choice", "activation": "relu"},
    },
    base_architecture="NystromformerModel",
    fixed={
        "embedding.position_start": POSITION_START,
        "position.name": "absolute",
        "pooler": None,
        "encoder.attention.name": ATTENTION,
    },
    description="Nyströmformer: landmark attention (num_landmarks, segment means, pseudo-inverse), value convolution",
    tokenizer=BERT_TOKENIZER,
)


def bertblocks_register_components() -> list[Component]:
    return [
        Component("family", NYSTROMFORMER.model_type, lambda **_: NYSTROMFORMER, description=NYSTROMFORMER.description)
    ]
