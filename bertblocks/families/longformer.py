"""Longformer (transformers' ``longformer``): RoBERTa with the ``longformer`` attention in every layer.

What differs from RoBERTa: each layer's self-attention is a sliding window of ``attention_window[i]`` keys (half on
each side) plus global tokens (``global_attention_mask``) with their own ``query_global``/``key_global``/
``value_global`` projections (:mod:`bertblocks.plugins.longformer`); the checkpoint prefix is ``longformer.``.
``attention_window`` is one even number for every layer or a list of one per layer; layers whose window differs from
the first layer's become ``encoder.overrides``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError
from bertblocks.families.family import Family
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import KeyMap

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .roberta import LM_HEAD_RULES, roberta_tokenizer

#: LongformerConfig's defaults where they differ from BERT's: what a config.json without the field means
DEFAULTS: dict[str, Any] = {"attention_window": 512, "pad_token_id": 1}
ATTENTION = "longformer"


class LongformerConfigError(BertBlocksError, ValueError):
    """A Longformer config.json field bertblocks cannot build (a window that is odd, or a list of the wrong length)."""


def _windows(value: Any, num_layers: Any) -> list[int]:
    """``attention_window`` as the distinct windows of the layers: ``[w]`` for one number (every layer), else the
    list of one even positive number per layer (its length checked against ``num_hidden_layers``, which may be any
    declared integer: one number is never expanded into a list of that many)."""
    windows = [value] if isinstance(value, int) else list(value)
    if not isinstance(value, int) and len(windows) != num_layers:
        raise LongformerConfigError(
            f"attention_window={value!r} is not supported: a list needs one window per layer "
            f"(num_hidden_layers={num_layers}), got {len(windows)}"
        )
    for window in windows:
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0 or window % 2:
            raise LongformerConfigError(
                f"attention_window={value!r} is not supported: each window must be an even positive integer "
                f"(half of it on each side of a token), got {window!r}"
            )
    return windows


def longformer_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    windows = _windows(src.pop("attention_window"), src.get("num_hidden_layers", 12))
    data = bert_fields_from_hf(src)  # RoBERTa's position offset and the attention's name: Family.fixed
    encoder = data.setdefault("encoder", {})
    encoder["attention"] = {**encoder.get("attention", {}), "attention_window": windows[0]}
    others = sorted({w for w in windows if w != windows[0]})
    if others:  # one override per window that differs from the first layer's
        encoder["overrides"] = [
            {"layers": [i for i, w in enumerate(windows) if w == window], "attention": {"attention_window": window}}
            for window in others
        ]
    return data


def longformer_to_hf(config: BertConfig) -> dict[str, Any]:
    enc = config.encoder
    # a layer without the longformer attention has no window to write: the save then finds that the file would
    # mean another model (the translation's contradiction check) and refuses it, naming encoder.attention.name
    windows = [
        int(enc.layer_spec(i, "attention").options().get("attention_window", DEFAULTS["attention_window"]))
        for i in range(enc.num_layers)
    ]
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    out["attention_window"] = windows  # as transformers writes it: one per layer
    return out


#: every config.json field longformer_from_hf reads: BERT's and the windows
FIELDS = {
    **BERT_FIELDS,
    "attention_window": HFField(
        (int, list), gt=0, items=int, doc="window per layer (even; one number for all layers, or a list)"
    ),
}

KEY_MAP = KeyMap(prefix="longformer", rules=LM_HEAD_RULES, head_prefixes=("lm_head.", "classifier.", "qa_outputs."))

LONGFORMER = Family(
    model_type="longformer",
    config_from_hf=longformer_from_hf,
    config_to_hf=longformer_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "LongformerForMaskedLM": "masked_lm_gelu",
        "LongformerForSequenceClassification": {"name": "dense_classification", "activation": "tanh"},
        "LongformerForTokenClassification": "token_classification",
        "LongformerForQuestionAnswering": "question_answering",
        "LongformerForMultipleChoice": "multiple_choice",
    },
    base_architecture="LongformerModel",
    fixed={"embedding.position_offset": "padding", "position.name": "absolute", "encoder.attention.name": ATTENTION},
    description="Longformer: RoBERTa with sliding-window + global attention (attention_window, global_attention_mask)",
    tokenizer=roberta_tokenizer("Longformer"),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", LONGFORMER.model_type, lambda **_: LONGFORMER, description=LONGFORMER.description)]
