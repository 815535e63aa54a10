"""The BERT-shaped fields of a family's ``config.json``, both ways: public API for family plugin authors.

Many families' ``config.json`` is BERT's with other defaults and a few extras (RoBERTa, ELECTRA, ERNIE, DeBERTa,
…). A family plugin reads those fields with :func:`bert_fields_from_hf`, adds its own, and writes them back with
:func:`bert_fields_to_hf`; both go through the one table of transformers' flat names
(:data:`~bertblocks.config.flat_view.FLAT_FIELDS`, :data:`~bertblocks.config.flat_view.FLAT_ALIASES`), the
names the config itself answers to (``config.num_hidden_layers``), so a family never spells them out again.

Nothing here validates: a translation is a config dict holding what the file says, which the load validates
once, with everything else (a family's ``config_from_hf`` returns a dict; see
``docs/plugins/writing-a-plugin.md``, "Writing a family").

Example:
    >>> data = bert_fields_from_hf({"hidden_size": 32, "num_attention_heads": 4, "my_switch": True})
    >>> data["hidden_size"], data["encoder"]["attention"]["num_heads"], data["hf"]
    (32, 4, {'my_switch': True})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.config.flat_view import FLAT_ALIASES, FLAT_FIELDS

from .fields import HFField

__all__ = [
    "BERT_FIELDS",
    "BERT_FIELD_NAMES",
    "POSITION_FIELD",
    "bert_fields_from_hf",
    "bert_fields_to_hf",
    "default",
    "token_id",
]

#: BERT's name for the position scheme (its values ``absolute``, ``relative_key``, ``relative_key_query`` are
#: bertblocks' position scheme names)
POSITION_FIELD = "position_embedding_type"
#: the names :func:`bert_fields_from_hf` reads (a key close to one of them is likely a misspelling: loading warns)
BERT_FIELD_NAMES: tuple[str, ...] = (*FLAT_FIELDS, *FLAT_ALIASES, POSITION_FIELD)

_SIZE = HFField(int, ge=1)
_RATE = HFField(float, ge=0, le=1)
#: the declaration (:class:`~bertblocks.families.fields.HFField`) of every field :func:`bert_fields_from_hf` reads,
#: as transformers' ``BertConfig`` types them: a family that reads them declares ``{**BERT_FIELDS, **its own}`` in
#: ``Family.fields`` (a family whose defaults or ranges differ overrides the entry)
BERT_FIELDS: dict[str, HFField] = {
    "vocab_size": _SIZE,
    "hidden_size": _SIZE,
    "max_position_embeddings": _SIZE,
    "type_vocab_size": HFField(int, ge=0),
    "pad_token_id": HFField(int, ge=0, nullable=True),
    "layer_norm_eps": HFField(float, gt=0),
    "hidden_dropout_prob": _RATE,
    "initializer_range": HFField(float, gt=0),
    "pruned_heads": HFField(dict),
    "is_decoder": HFField(bool),
    "add_cross_attention": HFField(bool),
    "use_cache": HFField(bool),
    "tie_word_embeddings": HFField(bool),
    "num_labels": HFField(int, ge=1),
    "id2label": HFField(dict, nullable=True),
    "label2id": HFField(dict, nullable=True),
    "problem_type": HFField(
        str, nullable=True, choices=("regression", "single_label_classification", "multi_label_classification")
    ),
    "classifier_dropout": HFField(float, ge=0, le=1, nullable=True),
    "num_hidden_layers": _SIZE,
    "num_attention_heads": _SIZE,
    "attention_probs_dropout_prob": _RATE,
    "intermediate_size": _SIZE,
    "hidden_act": HFField(str),
    "chunk_size_feed_forward": HFField(int, ge=0),
    POSITION_FIELD: HFField(str, nullable=True),
}


def default(field: str) -> Any:
    """The schema's default of a top-level config field: what a ``config.json`` without it means to bertblocks.

    Args:
        field: a top-level field of :class:`~bertblocks.config.BertConfig` (``hidden_size``, ``vocab_size``, …).

    Returns:
        The default value (a fresh one for fields with a default factory).

    Raises:
        KeyError: ``field`` is no top-level config field.
    """
    return BertConfig.model_fields[field].get_default(call_default_factory=True)


def bert_fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The BERT fields of a BERT-shaped ``config.json`` as a bertblocks config dict (the YAML form).

    Reads the flat names (``hidden_size``, ``num_hidden_layers``, ``intermediate_size``, ``hidden_act``, …) into
    their nested places and ``position_embedding_type`` into ``position.name`` (``null``, as transformers
    writes it, meaning ``absolute``). Every other field goes, unchanged, to ``data["hf"]``: the passthrough
    that :func:`bert_fields_to_hf` writes back, so a field bertblocks does not model survives a load and save.
    A family pops the fields it translates itself from ``hf`` before calling this (or from ``data["hf"]``
    after).

    The dict holds what the file says and nothing else (the schema's defaults fill the rest when the config is
    validated), with ``embedding``, ``encoder.attention`` and ``encoder.feedforward`` present for a family to
    add to.

    Args:
        hf: the ``config.json`` as a mapping (not modified). ``model_type`` and ``architectures`` are ignored:
            the caller sets ``family`` and the head from them.

    Returns:
        A config dict with the BERT fields, and ``hf`` holding every other field.
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
    """The BERT fields of a validated config under transformers' flat names, with the ``hf`` passthrough.

    The inverse of :func:`bert_fields_from_hf` for the fields it reads: ``position_embedding_type`` is the
    position scheme's name; ``num_labels`` is left out (transformers derives it from ``id2label``).

    Args:
        config: the validated config.
        dropped: fields the family's ``config.json`` does not have (DeBERTa's ``position_embedding_type``),
            left out of the result.

    Returns:
        The flat fields; ``model_type``, ``architectures`` and the ``bertblocks`` block are left to the caller,
        which knows the family.
    """
    out = config.to_dict()
    # transformers derives num_labels from id2label and writes only the latter
    for key in ("model_type", "architectures", "num_labels", *dropped):
        out.pop(key, None)
    if POSITION_FIELD not in dropped:
        out[POSITION_FIELD] = config.position.name
    return out


def token_id(config: BertConfig, name: str, default: int) -> int:
    """A special token's id (``sep_token_id``, …) as the model's ``config.json`` gives it (kept in ``config.hf``,
    where every field the translation does not model goes), else ``default``: transformers' config class's default
    for the family, what transformers reads from a file without the field. For a family's input defaults that find
    a token in ``input_ids`` (Longformer's question, BigBird's question mask)."""
    value = (config.hf or {}).get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else default
