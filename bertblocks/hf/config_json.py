"""A checkpoint's ``config.json`` (transformers' flat format) ↔ :class:`~bertblocks.config.BertConfig`, both ways.

transformers' field names map onto the nested schema here (:data:`HF_TOP_LEVEL`, :data:`HF_NESTED`); the
``architectures`` entry names the task head through what the head plugins declare
(:attr:`bertblocks.core.component.Component.architecture`), so a third-party head with a transformers
class name round-trips like a built-in one. What transformers cannot express (the attention backend,
non-default component names, plugin options, per-layer overrides) travels under a ``bertblocks`` key, which
transformers keeps as an inert attribute.

Importing this module installs it behind :meth:`BertConfig.from_hf` / :meth:`BertConfig.to_hf`.

Example:
    >>> cfg = config_from_hf(json.loads(Path("bert/config.json").read_text()))
    >>> config_to_hf(cfg)["architectures"]
    ['BertModel']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from ..config import (
    BertConfig,
    ComponentSpec,
    ConfigError,
    ConfigIssue,
    deep_merge,
    issues_from_validation_error,
)
from ..config.schema import set_checkpoint_format
from ..registry import Registry, get_registry
from .misspelt_keys import warn_misspelt_keys

#: the ``model_type`` this translation reads and writes
MODEL_TYPE = "bert"
#: ``architectures`` of a model without a head
BACKBONE_ARCHITECTURE = "BertModel"
#: transformers' fields with the same name and meaning at our top level
HF_TOP_LEVEL = (
    "vocab_size",
    "hidden_size",
    "max_position_embeddings",
    "type_vocab_size",
    "pad_token_id",
    "layer_norm_eps",
    "hidden_dropout_prob",
    "initializer_range",
    "pruned_heads",
    "is_decoder",
    "add_cross_attention",
    "use_cache",
    "tie_word_embeddings",
    "num_labels",
    "id2label",
    "label2id",
    "problem_type",
    "classifier_dropout",
)
#: transformers' flat field → our nested path
HF_NESTED: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("encoder", "num_layers"),
    "num_attention_heads": ("encoder", "attention", "num_heads"),
    "attention_probs_dropout_prob": ("encoder", "attention", "dropout"),
    "intermediate_size": ("encoder", "feedforward", "intermediate_size"),
    "hidden_act": ("encoder", "feedforward", "activation"),
    "chunk_size_feed_forward": ("encoder", "chunk_size_feed_forward"),
}
#: written by transformers at save time and meaningless to carry over (rewritten by whoever saves next)
HF_DROPPED = ("model_type", "_name_or_path", "_attn_implementation_autoset")


def head_architectures(registry: Registry | None = None) -> dict[str, str]:
    """transformers' task-model class → head name, from what the registered heads declare.

    Example:
        >>> head_architectures()["BertForMaskedLM"]
        'masked_lm'
    """
    reg = registry or get_registry()
    return {c.architecture: c.name for c in reg.components("head") if c.architecture}


def config_from_hf(hf: Mapping[str, Any], registry: Registry | None = None) -> BertConfig:
    """Read a BERT ``config.json`` dict (transformers 4.x or 5.x).

    Fields bertblocks does not model are kept in :attr:`BertConfig.hf` and written back by
    :func:`config_to_hf`. A ``bertblocks`` key (what :func:`config_to_hf` writes for choices transformers
    cannot express) is merged over the result.

    Raises:
        ConfigError: another ``model_type``, or fields that do not validate (each with its path).
    """
    src = dict(hf)
    model_type = src.get("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise ConfigError([ConfigIssue("model_type", f"expected {MODEL_TYPE!r}, got {model_type!r}")], "config.json")
    data: dict[str, Any] = {
        "encoder": {"attention": {}, "feedforward": {}},
        "position": {"name": src.pop("position_embedding_type", "absolute") or "absolute"},
    }
    for key in HF_TOP_LEVEL:
        if key in src:
            data[key] = src.pop(key)
    for hf_key, (*path, leaf) in HF_NESTED.items():
        if hf_key in src:
            node = data
            for part in path:
                node = node[part]
            node[leaf] = src.pop(hf_key)
    ours = src.pop("bertblocks", None) or {}
    architectures = src.get("architectures")
    heads = head_architectures(registry)
    if architectures == [BACKBONE_ARCHITECTURE]:
        src.pop("architectures")  # the default, rewritten by config_to_hf
    elif isinstance(architectures, list) and len(architectures) == 1 and architectures[0] in heads:
        # a task checkpoint: its class names the head (BertForMaskedLM → masked_lm); config_to_hf writes it back
        data["head"] = {"name": heads[src.pop("architectures")[0]]}
    for key in HF_DROPPED:
        src.pop(key, None)
    warn_misspelt_keys(src, (*HF_TOP_LEVEL, *HF_NESTED, "position_embedding_type", "architectures", "bertblocks"))
    data["hf"] = src
    data = deep_merge(data, ours)
    try:
        return BertConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(issues_from_validation_error(e, model=BertConfig), "config.json") from None


def config_to_hf(config: BertConfig, registry: Registry | None = None) -> dict[str, Any]:
    """A ``config.json`` dict that transformers' ``BertConfig`` reads unchanged.

    ``architectures`` is the class the head declares (:data:`BACKBONE_ARCHITECTURE` without a head, or for a
    head that declares none).
    """
    enc = config.encoder
    architecture = None
    if config.head is not None:
        architecture = {name: arch for arch, name in head_architectures(registry).items()}.get(config.head.name)
    out: dict[str, Any] = {"model_type": MODEL_TYPE, "architectures": [architecture or BACKBONE_ARCHITECTURE]}
    out.update(config.hf)
    out.update({key: getattr(config, key) for key in HF_TOP_LEVEL if key != "num_labels"})
    out["id2label"] = {str(k): v for k, v in (config.id2label or {}).items()}
    out.update(
        {
            "num_hidden_layers": enc.num_layers,
            "num_attention_heads": enc.attention.num_heads,
            "attention_probs_dropout_prob": enc.attention.dropout,
            "intermediate_size": enc.feedforward.intermediate_size,
            "hidden_act": enc.feedforward.activation,
            "chunk_size_feed_forward": enc.chunk_size_feed_forward,
            "position_embedding_type": config.position.name,
            "pruned_heads": {str(k): v for k, v in config.pruned_heads.items()},
        }
    )
    extra = _diff(_without_default_options(config), config_from_hf(dict(out.items()), registry).model_dump())
    if extra:
        out["bertblocks"] = extra
    return out


class _HFConfigJson:
    """:func:`config_from_hf` / :func:`config_to_hf` behind :meth:`BertConfig.from_hf` / :meth:`BertConfig.to_hf`
    (with the process-wide registry)."""

    def from_hf(self, data: Mapping[str, Any]) -> BertConfig:
        return config_from_hf(data)

    def to_hf(self, config: BertConfig) -> dict[str, Any]:
        return config_to_hf(config)


set_checkpoint_format(_HFConfigJson())


def _without_default_options(model: BaseModel) -> dict[str, Any]:
    """``model.model_dump()`` without the plugin options that still hold the defaults ``validate`` filled in
    (:meth:`ComponentSpec.changed_options`), so that a default config writes no ``bertblocks`` key."""
    out = model.model_dump()
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out[name] = _without_default_options(value)
        elif isinstance(value, list | dict):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(item, BaseModel):
                    out[name][key] = _without_default_options(item)
    if isinstance(model, ComponentSpec):
        changed = model.changed_options()
        for key in model.options():
            if key not in changed:
                del out[key]
    return out


def _diff(full: Any, base: Any) -> Any:
    """The parts of ``full`` that differ from ``base`` (nested dicts), or ``None`` if none do."""
    if isinstance(full, dict) and isinstance(base, dict):
        if "name" in full and full.get("name") != base.get("name"):
            # another component: reading it back starts its spec afresh (its plugin's options are not the
            # other's), so every field travels, the typed ones (num_heads, intermediate_size) included
            return {k: v for k, v in full.items() if k != "hf"}
        out = {}
        for key, value in full.items():
            if key == "hf":
                continue
            if key not in base:
                out[key] = value
                continue
            sub = _diff(value, base[key])
            if sub is not None:
                out[key] = sub
        # a component's name must travel with its options, or from_hf would not know whose they are
        if out and "name" in full and "name" not in out:
            out["name"] = full["name"]
        return out or None
    return None if full == base else full


__all__ = ["HF_NESTED", "HF_TOP_LEVEL", "config_from_hf", "config_to_hf", "head_architectures"]
