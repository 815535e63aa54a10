"""Longformer (transformers' ``longformer``): RoBERTa with the ``longformer`` attention in every layer.

What differs from RoBERTa: each layer's self-attention is a sliding window of ``attention_window[i]`` keys (half on
each side) plus global tokens (``global_attention_mask``) with their own ``query_global``/``key_global``/
``value_global`` projections (:mod:`bertblocks.plugins.longformer`); the checkpoint prefix is ``longformer.``.
``attention_window`` is one even number for every layer or a list of one per layer; layers whose window differs from
the first layer's become ``encoder.overrides``.

Global tokens a call leaves out are chosen as transformers' task classes choose them (:data:`INPUT_DEFAULTS`, the
family's ``input_defaults``): the sequence classifier makes the first token global, question answering every token
before the first ``sep_token_id`` (the question), multiple choice every token after the ``</s></s>`` that ends each
choice's question; the last two need exactly three separators per row, as transformers does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError, InputError
from bertblocks.families.family import Family
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import KeyMap

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf, token_id
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


#: LongformerConfig's default ``sep_token_id`` (a config.json without the field means it)
SEP_TOKEN_ID = 2
#: global attention's input, Longformer's attention reads it (:mod:`bertblocks.plugins.longformer`)
GLOBAL = "global_attention_mask"


def _first_token(inputs: Mapping[str, torch.Tensor | None], config: BertConfig) -> torch.Tensor | None:
    """``LongformerForSequenceClassification``: global attention on the first token (``<s>``) of every row."""
    ids, embeds = inputs.get("input_ids"), inputs.get("inputs_embeds")
    shape = tuple(ids.shape) if ids is not None else tuple(embeds.shape[:-1]) if embeds is not None else None
    if shape is None:
        return None
    device = (ids if ids is not None else embeds).device  # type: ignore[union-attr]
    mask = torch.zeros(shape, dtype=torch.long, device=device)
    mask[..., 0] = 1
    return mask


def _question_end(ids: torch.Tensor, sep: int, task: str) -> torch.Tensor:
    """The position of each row's first separator ``[..., 1]``; transformers' ``_get_question_end_index`` asks for
    exactly three per row (``<s> question </s></s> context </s>``) and so does this, naming the rows that differ."""
    is_sep = ids == sep  # [..., q]
    if not torch.compiler.is_compiling():  # a data-dependent check: eager only (a graph would break on it)
        counts = is_sep.sum(-1).reshape(-1)
        wrong = (counts != 3).nonzero()[:, 0].tolist()
        if wrong:
            raise InputError(
                f"{task} puts global attention on the question, found through sep_token_id={sep}: every row must "
                f"have exactly three (<s> question </s></s> context </s>), rows {wrong[:5]} of the flattened batch "
                f"have {[int(counts[i]) for i in wrong[:5]]}; pass global_attention_mask to choose the global tokens"
            )
    return is_sep.int().argmax(dim=-1, keepdim=True)  # [..., 1]


def _question_tokens(inputs: Mapping[str, torch.Tensor | None], config: BertConfig) -> torch.Tensor | None:
    """``LongformerForQuestionAnswering``: global attention on every token before the first separator (``<s>`` and
    the question); none from ``inputs_embeds`` alone, as transformers."""
    ids = inputs.get("input_ids")
    if ids is None:
        return None
    end = _question_end(ids, token_id(config, "sep_token_id", SEP_TOKEN_ID), "LongformerForQuestionAnswering")
    return torch.arange(ids.shape[-1], device=ids.device) < end  # [b, q]


def _choice_tokens(inputs: Mapping[str, torch.Tensor | None], config: BertConfig) -> torch.Tensor | None:
    """``LongformerForMultipleChoice``: per choice, global attention on every token after the ``</s></s>`` that ends
    the question (the choice's answer, its last ``</s>`` and any padding, which stays local); none from
    ``inputs_embeds`` alone."""
    ids = inputs.get("input_ids")
    if ids is None:
        return None
    end = _question_end(ids, token_id(config, "sep_token_id", SEP_TOKEN_ID), "LongformerForMultipleChoice")
    return torch.arange(ids.shape[-1], device=ids.device) > end + 1  # [b, c, q]


#: head → the global tokens transformers' class for it chooses when a call gives no ``global_attention_mask``
INPUT_DEFAULTS = {
    "dense_classification": {GLOBAL: _first_token},
    "question_answering": {GLOBAL: _question_tokens},
    "multiple_choice": {GLOBAL: _choice_tokens},
}

#: every config.json field longformer_from_hf reads: BERT's and the windows
FIELDS = {
    **BERT_FIELDS,
    "sep_token_id": HFField(int, ge=0, nullable=True, doc="ends the question: where task heads put global tokens"),
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
    input_defaults=INPUT_DEFAULTS,
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", LONGFORMER.model_type, lambda **_: LONGFORMER, description=LONGFORMER.description)]
