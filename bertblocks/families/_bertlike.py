"""Shared by the families whose config.json is BERT's with other defaults and extras (BERT itself, RoBERTa,
ELECTRA, ERNIE, …): the BERT fields under transformers' flat names, read and written through the one table of
them (:data:`~bertblocks.config.flat_view.FLAT_FIELDS`, :data:`~bertblocks.config.flat_view.FLAT_ALIASES`).

Nothing here validates: a translation is a config dict holding what the file says, which the load validates
once, with everything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.config.flat_view import FLAT_ALIASES, FLAT_FIELDS

#: transformers' task-model suffixes for the BERT-shaped heads, with the head each means
BERT_SHAPED_HEADS: dict[str, str] = {
    "ForTokenClassification": "token_classification",
    "ForQuestionAnswering": "question_answering",
}
#: BERT's name for the position scheme (``absolute``, ``relative_key``, ``relative_key_query``: bertblocks' names)
POSITION_FIELD = "position_embedding_type"
#: the names :func:`bert_fields_from_hf` reads (a key close to one of them is likely a misspelling)
BERT_FIELD_NAMES: tuple[str, ...] = (*FLAT_FIELDS, *FLAT_ALIASES, POSITION_FIELD)


def default(field: str) -> Any:
    """The schema's default of a top-level field (what a config.json without it means)."""
    return BertConfig.model_fields[field].get_default(call_default_factory=True)


def bert_fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The BERT fields of a BERT-like ``config.json`` as a bertblocks config dict; other fields go to ``hf``.

    The dict holds what the file says and nothing else (the schema's defaults fill the rest when the config is
    validated), with ``embedding``, ``encoder.attention`` and ``encoder.feedforward`` present for a family to
    add to. ``model_type`` and ``architectures`` are left to the caller (the family's class names differ from
    BERT's).
    """
    src = {k: v for k, v in hf.items() if k not in ("model_type", "architectures")}
    data: dict[str, Any] = {"embedding": {}, "encoder": {"attention": {}, "feedforward": {}}}
    for key in FLAT_FIELDS:
        if key in src:
            data[key] = src.pop(key)
    for key, path in FLAT_ALIASES.items():
        if key in src:
            *parents, leaf = path.split(".")
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = src.pop(key)
    if POSITION_FIELD in src:
        data["position"] = {"name": src.pop(POSITION_FIELD) or "absolute"}  # transformers writes null for absolute
    data["hf"] = src
    return data


def bert_fields_to_hf(config: BertConfig, dropped: tuple[str, ...] = ()) -> dict[str, Any]:
    """The BERT fields of ``config`` under HF's flat names (with the ``hf`` extras), minus ``dropped`` (fields the
    family lacks).

    ``model_type``, ``architectures`` and the ``bertblocks`` block are left to the caller, which knows the family.
    """
    out = config.to_dict()
    # transformers derives num_labels from id2label and writes only the latter
    for key in ("model_type", "architectures", "num_labels", *dropped):
        out.pop(key, None)
    if POSITION_FIELD not in dropped:
        out[POSITION_FIELD] = config.position.name
    return out
