"""DistilBERT: BERT's post-LN layers under other names (``q_lin``, ``sa_layer_norm``, ``ffn.lin1`` …), no token
types, no pooler; its classifiers put a ``pre_classifier`` (dense → relu) before the output layer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.keymap import KeyMap, Rename

from ..errors import InputError
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf

_LAYER = "distilbert.transformer.layer.{i}"
_OURS = "bert.encoder.layer.{i}"
_DENSE = ("dense_classification", "dense_multiple_choice")
KEY_MAP = KeyMap(
    prefix="distilbert",
    rules=(
        Rename(f"{_LAYER}.attention.q_lin", f"{_OURS}.attention.self.query"),
        Rename(f"{_LAYER}.attention.k_lin", f"{_OURS}.attention.self.key"),
        Rename(f"{_LAYER}.attention.v_lin", f"{_OURS}.attention.self.value"),
        Rename(f"{_LAYER}.attention.out_lin", f"{_OURS}.attention.output.dense"),
        Rename(f"{_LAYER}.sa_layer_norm", f"{_OURS}.attention.output.LayerNorm"),
        Rename(f"{_LAYER}.ffn.lin1", f"{_OURS}.intermediate.dense"),
        Rename(f"{_LAYER}.ffn.lin2", f"{_OURS}.output.dense"),
        Rename(f"{_LAYER}.output_layer_norm", f"{_OURS}.output.LayerNorm"),
        Rename("distilbert.transformer", "bert.encoder"),
        Rename("vocab_transform", "cls.predictions.transform.dense"),
        Rename("vocab_layer_norm", "cls.predictions.transform.LayerNorm"),
        Rename("vocab_projector.weight", "cls.predictions.decoder.weight"),
        Rename("vocab_projector.bias", "cls.predictions.bias"),
        Rename("pre_classifier", "classifier.dense", heads=_DENSE),
        Rename("classifier", "classifier.out_proj", heads=_DENSE),
    ),
    head_prefixes=("vocab_", "pre_classifier.", "classifier.", "qa_outputs."),
)
#: DistilBertConfig's names → ours (its attribute_map aliases hidden_size etc. to these)
_NAMES = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "activation": "hidden_act",
}
#: BERT's fields DistilBertConfig does not have (a config.json that sets them means another model)
_ABSENT = ("type_vocab_size", "layer_norm_eps", "position_embedding_type")
_LAYER_NORM_EPS = 1e-12  # hard-coded in DistilBERT's modules


def _from_hf(hf: Any) -> dict[str, Any]:
    src = {k: v for k, v in hf.items() if k != "architectures"}
    for field in _ABSENT:
        if field in src:
            raise InputError(f"{field} is not a DistilBERT config field (DistilBERT has no such choice)")
    renamed = {_NAMES.get(k, k): v for k, v in src.items()}
    renamed["type_vocab_size"] = 1  # unused: the embedding has no token-type table
    return bert_fields_from_hf(renamed)  # no token types, no pooler, its epsilon: `fixed`, applied by the translator


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(
        config, dropped=("type_vocab_size", "layer_norm_eps", "position_embedding_type", "chunk_size_feed_forward")
    )
    inverse = {ours: theirs for theirs, ours in _NAMES.items()}
    return {inverse.get(k, k): v for k, v in out.items()}


#: DistilBertConfig's fields: BERT's under DistilBERT's names (no token types, no epsilon, no position choice)
FIELDS = {
    **{name: declared for name, declared in BERT_FIELDS.items() if name not in (*_NAMES.values(), *_ABSENT)},
    **{theirs: BERT_FIELDS[ours] for theirs, ours in _NAMES.items()},
}

DISTILBERT = Family(
    model_type="distilbert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "DistilBertForMaskedLM": "masked_lm",
        "DistilBertForSequenceClassification": {"name": "dense_classification", "activation": "relu"},
        "DistilBertForTokenClassification": "token_classification",
        "DistilBertForQuestionAnswering": "question_answering",
        "DistilBertForMultipleChoice": {"name": "dense_multiple_choice", "activation": "relu"},
    },
    base_architecture="DistilBertModel",
    fixed={
        "embedding.token_types": False,
        "pooler": None,
        "position.name": "absolute",
        "layer_norm_eps": _LAYER_NORM_EPS,
    },
    description="DistilBERT: BERT layers renamed, no token types, no pooler, pre_classifier heads",
    # BERT's WordPiece framing, but the model takes no token types
    tokenizer=replace(
        BERT_TOKENIZER,
        model_input_names=("input_ids", "attention_mask"),
        tokenizer_classes=("DistilBertTokenizer", "DistilBertTokenizerFast"),
    ),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "distilbert", lambda **_: DISTILBERT, description=DISTILBERT.description)]
