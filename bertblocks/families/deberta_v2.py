"""DeBERTa-v2 / v3 / mDeBERTa (``model_type: deberta-v2``): BERT's post-LN layers with disentangled attention.

What differs from BERT, as components: position ``disentangled`` (:mod:`bertblocks.plugins.disentangled`: one
log-bucketed relative table shared by every layer, normalised once, projected in every layer by that layer's own
query and key projections into content→position and position→content terms, scores scaled by
``1/√(d · (1 + terms))``; with ``absolute: true`` also BERT's learned absolute table, ``position_biased_input``);
``type_vocab_size: 0`` (v3: no token-type table, ``token_type_ids`` ignored); no pooler in the backbone; the
sequence classifier and multiple choice use the ``context_pooler`` pooler (``pooler_hidden_act``).

The checkpoint: prefix ``deberta.``; ``attention.self.{query,key,value}_proj`` ↔ BERT's
``attention.self.{query,key,value}``; the shared table ``deberta.encoder.rel_embeddings.weight`` is bertblocks'
``encoder.rel_embeddings.weight`` and its norm ``deberta.encoder.LayerNorm`` is ``encoder.rel_embeddings.LayerNorm``;
the classifier's ``pooler.dense`` is the backbone's ``pooler.dense``; the legacy masked LM head is BERT's
``cls.predictions``.

``conv_kernel_size`` > 0 (the ConvLayer after the first layer) is the layer ``post_ln_conv``
(:mod:`bertblocks.plugins.conv_layers`), its convolution at ``encoder.layer.0.conv`` (``deberta.encoder.conv``).

``relative_attention: false`` (DebertaV2Config's default) is the scheme without its table (``relative: false``):
absolute positions only, the configured ``pos_att_type`` still widening the softmax denominator as transformers does.

What is refused, naming the field: an even ``conv_kernel_size``, ``norm_rel_ebd: layer_norm`` without
``relative_attention`` (transformers builds an unused LayerNorm),
``embedding_size`` other than ``hidden_size``, ``attention_head_size`` other than ``hidden_size /
num_attention_heads``, ``norm_rel_ebd`` other than ``none`` / ``layer_norm``, ``pos_att_type`` other than
``c2p`` / ``p2c``, ``pooler_hidden_size`` other than ``hidden_size`` and ``pooler_dropout`` other than 0.
The masked LM of ``legacy: false`` (``lm_predictions.lm_head.*``) loads into the same head
and is saved under the legacy names;
the original EnhancedMaskDecoder (``mask_predictions.*``) is dropped on load, as transformers drops it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.keymap import Drop, KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .fields import HFField

#: transformers' task classes whose model has a ContextPooler (the backbone has none)
_POOLED = ("DebertaV2ForSequenceClassification", "DebertaV2ForMultipleChoice")
#: DebertaV2Config's defaults where they differ from BERT's (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 128100,
    "hidden_size": 1536,
    "num_hidden_layers": 24,
    "num_attention_heads": 24,
    "intermediate_size": 6144,
    "type_vocab_size": 0,
    "layer_norm_eps": 1e-7,
}

#: DeBERTa's two masked LM layouts (v1's too), read into one head
MASKED_LM_RULES = (
    # the masked LM is written as transformers' legacy head (`cls.predictions`, legacy: true, its default) ...
    Rename("cls.predictions", "cls.predictions"),
    # ... and read from the other layout too (legacy: false, the published checkpoints' `lm_predictions`):
    # the same dense → act → LayerNorm → tied decoder + bias, under other names
    Rename("lm_predictions.lm_head.dense", "cls.predictions.transform.dense"),
    Rename("lm_predictions.lm_head.LayerNorm", "cls.predictions.transform.LayerNorm"),
    Rename("lm_predictions.lm_head.bias", "cls.predictions.bias"),
    # the original EnhancedMaskDecoder's weights, which transformers ignores on load too
    Drop("mask_predictions"),
)

_L, _O = "deberta.encoder.layer.{i}.attention.self", "bert.encoder.layer.{i}.attention.self"
KEY_MAP = KeyMap(
    prefix="deberta",
    rules=(
        Rename(f"{_L}.query_proj", f"{_O}.query"),
        Rename(f"{_L}.key_proj", f"{_O}.key"),
        Rename(f"{_L}.value_proj", f"{_O}.value"),
        Rename(f"{_L}.pos_key_proj", f"{_O}.disentangled.pos_key_proj"),
        Rename(f"{_L}.pos_query_proj", f"{_O}.disentangled.pos_query_proj"),
        Rename("deberta.encoder.LayerNorm", "bert.encoder.rel_embeddings.LayerNorm"),
        Rename("pooler.dense", "bert.pooler.dense"),
        Rename("deberta.encoder.conv", "bert.encoder.layer.0.conv"),
        *MASKED_LM_RULES,
    ),
    head_prefixes=("cls.", "classifier.", "qa_outputs.", "pooler.", "lm_predictions.", "mask_predictions."),
)

FIXED: dict[str, Any] = {
    "position.name": "disentangled",
    "encoder.attention.name": "bert",
    "is_decoder": False,
    "add_cross_attention": False,
}


class DebertaConfigError(BertBlocksError, ValueError):
    """A DeBERTa-v2 ``config.json`` field bertblocks does not implement."""


def _refuse(field: str, value: Any, why: str, model_type: str = "deberta-v2") -> DebertaConfigError:
    return DebertaConfigError(f"{model_type} config.json: {field}={value!r} is not supported: {why}")


def context_pooler_from_hf(
    src: dict[str, Any], hf: Mapping[str, Any], pooled: tuple[str, ...], model_type: str = "deberta-v2"
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The context pooler of a deberta or deberta-v2 config.json, its fields popped from ``src`` (and
    ``cls_dropout`` renamed ``classifier_dropout`` there, for BERT's translator).

    transformers' ``DebertaModel`` / ``DebertaV2Model`` build no pooler; the task classes ``pooled`` (named in
    ``architectures``) have a ``ContextPooler``, with ``pooler_hidden_act``. A config.json without one of them keeps a
    ``pooler_hidden_act`` other than the default in ``config.hf``, so that it is written back.

    Returns:
        The ``pooler`` spec (``None``: no pooler), and the fields to keep in ``config.hf`` for the round trip.

    Raises:
        DebertaConfigError: ``pooler_hidden_size`` other than the hidden size, or a ``pooler_dropout``.
    """
    hidden = src.get("hidden_size", 768)
    pooler_size = src.pop("pooler_hidden_size", hidden)
    if pooler_size != hidden:
        raise _refuse("pooler_hidden_size", pooler_size, f"the pooler is hidden_size ({hidden}) wide", model_type)
    pooler_dropout = src.pop("pooler_dropout", 0.0)
    if pooler_dropout:
        raise _refuse("pooler_dropout", pooler_dropout, "the context pooler drops nothing (set it to 0)", model_type)
    activation = src.pop("pooler_hidden_act", "gelu")
    if "cls_dropout" in src:
        src["classifier_dropout"] = src.pop("cls_dropout")
    if hf.get("architectures") in [[c] for c in pooled]:
        return {"name": "context_pooler", "activation": activation}, {}
    return None, ({"pooler_hidden_act": activation} if activation != "gelu" else {})


def context_pooler_to_hf(config: BertConfig) -> dict[str, Any]:
    """The context pooler's fields of a deberta or deberta-v2 config.json (see :func:`context_pooler_from_hf`)."""
    out: dict[str, Any] = {"pooler_hidden_size": config.hidden_size, "pooler_dropout": 0.0}
    if config.pooler is not None:
        out["pooler_hidden_act"] = config.pooler.options().get("activation", "gelu")
    if config.classifier_dropout is not None:
        out["cls_dropout"] = config.classifier_dropout
    return out


def _terms(value: Any, model_type: str = "deberta-v2") -> list[str]:
    """``pos_att_type`` (a list, or a string ``"c2p|p2c"``, as DeBERTa v1's checkpoints write it) → its terms."""
    if value is None:
        return []
    if not isinstance(value, str | list | tuple):
        raise _refuse("pos_att_type", value, "must be a list of c2p, p2c (or a string 'p2c|c2p')", model_type)
    items = [x.strip() for x in value.lower().split("|")] if isinstance(value, str) else list(value)
    for item in items:
        if item not in ("c2p", "p2c"):
            raise _refuse(
                "pos_att_type", value, f"{item!r} is not a position term bertblocks has (c2p, p2c)", model_type
            )
    return items


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    hidden, heads = src["hidden_size"], src["num_attention_heads"]
    relative = src.pop("relative_attention", False)
    # FIELDS types every field read here (the translator checks them first): no bool("false"), no 1.5 kernel
    kernel = src.pop("conv_kernel_size", 0) or 0
    conv_groups, conv_act = src.pop("conv_groups", 1), src.pop("conv_act", "tanh")
    if kernel > 0 and kernel % 2 == 0:
        raise _refuse("conv_kernel_size", kernel, "an even kernel changes the sequence length (transformers fails too)")
    embedding_size = src.pop("embedding_size", hidden)
    if embedding_size != hidden:
        raise _refuse(
            "embedding_size", embedding_size, f"the embedding projection is not implemented (hidden {hidden})"
        )
    head_size = src.pop("attention_head_size", 0) or None
    sizes = (head_size, heads, hidden)
    if head_size is not None and all(isinstance(x, int) for x in sizes) and head_size * heads != hidden:
        raise _refuse("attention_head_size", head_size, "heads must be hidden_size / num_attention_heads wide")
    norm = [x.strip() for x in str(src.pop("norm_rel_ebd", "none")).lower().split("|")]
    if any(x not in ("none", "layer_norm") for x in norm):
        raise _refuse("norm_rel_ebd", "|".join(norm), "only 'none' and 'layer_norm' exist in transformers")
    if "layer_norm" in norm and not relative:
        raise _refuse("norm_rel_ebd", "layer_norm", "a LayerNorm of the relative table without relative_attention")
    pooler, kept = context_pooler_from_hf(src, hf, _POOLED)
    # legacy: false names the masked LM's weights `lm_predictions.lm_head.*`; the key map reads them into the
    # same head, which is saved under the legacy names (legacy: true, transformers' default)
    src.pop("legacy", None)
    terms = _terms(src.pop("pos_att_type", None))
    for absent in ("use_cache", "is_decoder", "add_cross_attention"):  # DebertaV2Config has none of them
        src.pop(absent, None)
    position = {  # a disentangled scheme: FIXED, applied by the translator
        "position_buckets": src.pop("position_buckets", -1),
        "max_relative_positions": src.pop("max_relative_positions", -1),
        "norm": "layer_norm" in norm,
        "share_att_key": src.pop("share_att_key", False),
        "terms": terms,
        "absolute": src.pop("position_biased_input", True),
        "relative": relative,
    }
    data = bert_fields_from_hf(src)
    data["position"] = position
    if kernel > 0:  # the ConvLayer after the first layer
        data["encoder"]["layer"] = {
            "name": "post_ln_conv",
            "kernel_size": kernel,
            "groups": conv_groups,
            "activation": conv_act,
            "dropout": src.get("hidden_dropout_prob", 0.1),
        }
    data["pooler"] = pooler  # the sequence classifier's and multiple choice's ContextPooler
    data["hf"].update(kept)
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    dropped = ("position_embedding_type", "use_cache", "is_decoder", "add_cross_attention", "classifier_dropout")
    out = bert_fields_to_hf(config, dropped=dropped)
    o = config.position.options()
    out.update(
        relative_attention=o.get("relative", True),
        position_buckets=o.get("position_buckets", 256),
        max_relative_positions=o.get("max_relative_positions", -1),
        norm_rel_ebd="layer_norm" if o.get("norm", True) else "none",
        share_att_key=o.get("share_att_key", True),
        pos_att_type=list(o.get("terms", ("p2c", "c2p"))),
        position_biased_input=o.get("absolute", False),
        **context_pooler_to_hf(config),
    )
    layer = config.encoder.layer
    if layer.name == "post_ln_conv":
        conv = layer.options()
        out.update(
            conv_kernel_size=conv.get("kernel_size", 3),
            conv_groups=conv.get("groups", 1),
            conv_act=conv.get("activation", "tanh"),
        )
    elif layer.name != "post_ln":
        raise DebertaConfigError(f"encoder.layer {layer.name!r}: a deberta-v2 config.json has post-LN layers only")
    return out


# BERT's special tokens and templates; only transformers' tokenizer class names differ
DEBERTA_TOKENIZER = dataclasses.replace(
    BERT_TOKENIZER, tokenizer_classes=("DebertaV2Tokenizer", "DebertaV2TokenizerFast")
)

#: DebertaV2Config's fields: BERT's and the disentangled attention's, the ConvLayer's, the context pooler's
FIELDS = {
    **BERT_FIELDS,
    "relative_attention": HFField(bool),
    "position_buckets": HFField(int, ge=-1, nullable=True, doc="-1 or 0: no log buckets"),
    "max_relative_positions": HFField(int, ge=-1, nullable=True, doc="< 1: max_position_embeddings"),
    "norm_rel_ebd": HFField(str),
    "share_att_key": HFField(bool),
    "pos_att_type": HFField((list, str), items=str, nullable=True),
    "position_biased_input": HFField(bool),
    "conv_kernel_size": HFField(int, ge=0, nullable=True),
    "conv_groups": HFField(int, ge=1),
    "conv_act": HFField(str),
    "embedding_size": HFField(int, ge=1),
    "attention_head_size": HFField(int, ge=0, nullable=True),
    "pooler_hidden_size": HFField(int, ge=1),
    "pooler_dropout": HFField(float, ge=0, le=1),
    "pooler_hidden_act": HFField(str),
    "cls_dropout": HFField(float, ge=0, le=1, nullable=True),
    "legacy": HFField(bool),
}

DEBERTA_V2 = Family(
    model_type="deberta-v2",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "DebertaV2ForMaskedLM": "masked_lm",
        "DebertaV2ForSequenceClassification": "sequence_classification",
        "DebertaV2ForTokenClassification": "token_classification",
        "DebertaV2ForQuestionAnswering": "question_answering",
        "DebertaV2ForMultipleChoice": "multiple_choice",
    },
    base_architecture="DebertaV2Model",
    fixed=FIXED,
    description="DeBERTa-v2/v3: disentangled attention over a shared log-bucketed relative table, no token types",
    tokenizer=DEBERTA_TOKENIZER,
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "deberta-v2", lambda **_: DEBERTA_V2, description=DEBERTA_V2.description)]
