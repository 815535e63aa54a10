"""The flat, dict-like face of a config that the Hugging Face ecosystem reads.

Trainer, PEFT, accelerate, pipelines and sentence-transformers read a model's config as transformers'
configs look: ``config.model_type``, ``config.num_hidden_layers``, ``config.to_dict()``,
``config.get("tie_word_embeddings")``, ``config.use_return_dict`` … This mixin gives a pydantic config that
face without changing what it is: every alias reads (and, where it names a real field, writes) the nested
field it stands for, so there is one source of truth, and writes are validated like any other assignment.

The flat names here are the one table of them: the BERT family's ``config.json`` translation
(:mod:`bertblocks.families.bert`) reads and writes the same names through :data:`FLAT_FIELDS` and
:data:`FLAT_ALIASES`. ``to_dict()`` is the config under those names; it knows no checkpoint format (the
``config.json`` a checkpoint carries is :func:`bertblocks.hf.config_json.config_to_hf`'s, which adds what the
family's transformers class needs and a ``bertblocks`` block for what it cannot say).

Assignments are atomic: a value the config rejects (a field validator *or* a whole-config validator) leaves
the config exactly as it was, unlike pydantic's own ``validate_assignment``, which has already stored the
value when a model-level validator refuses it.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from ..errors import MissingAttributeError

#: the config's top-level fields that transformers' configs have under the same name and meaning
FLAT_FIELDS: tuple[str, ...] = (
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

#: flat transformers name → dotted path of the field it stands for
FLAT_ALIASES: dict[str, str] = {
    "num_hidden_layers": "encoder.num_layers",
    "num_attention_heads": "encoder.attention.num_heads",
    "attention_probs_dropout_prob": "encoder.attention.dropout",
    "intermediate_size": "encoder.feedforward.intermediate_size",
    "hidden_act": "encoder.feedforward.activation",
    "chunk_size_feed_forward": "encoder.chunk_size_feed_forward",
}

#: what transformers' configs answer for the switches bertblocks does not model (read-only constants)
CONSTANTS: dict[str, Any] = {
    "use_return_dict": True,
    "return_dict": True,
    "output_hidden_states": False,
    "output_attentions": False,
    "torchscript": False,
    "is_encoder_decoder": False,
    "tie_encoder_decoder": False,
    "task_specific_params": None,
    "bos_token_id": None,
    "eos_token_id": None,
    "sep_token_id": None,
    "decoder_start_token_id": None,
}

_MISSING = object()


class FlatConfigView:
    """Mixin for a pydantic config: transformers' flat attribute names, ``to_dict``/``get``, and atomic validated
    assignment.

    A class using it has a ``model_type`` (a field, property or class variable). ``to_dict`` writes the fields
    :attr:`flat_fields` names, the aliases of :attr:`flat_aliases` and the ``hf`` extras; a class whose flat
    form is another (a config of two configs) overrides it.
    """

    #: transformers' attribute names that read the nested field they name (see :data:`FLAT_ALIASES`)
    flat_aliases: ClassVar[dict[str, str]] = FLAT_ALIASES
    #: top-level fields written by ``to_dict`` under their own names (see :data:`FLAT_FIELDS`)
    flat_fields: ClassVar[tuple[str, ...]] = FLAT_FIELDS

    # ------------------------------------------------------------------------------- dict-like reading
    def to_dict(self) -> dict[str, Any]:
        """The config under transformers' flat names, JSON-ready, as ``PretrainedConfig.to_dict`` returns one:
        ``model_type``, the shared fields, the flat aliases and the ``hf`` extras (label and layer keys as
        strings, as JSON has them)."""
        out = self._hf_extra()
        for name in type(self).flat_fields:
            value = getattr(self, name)
            out[name] = {str(k): v for k, v in value.items()} if name in ("id2label", "pruned_heads") else value
        out.update({name: self._read_dotted(path) for name, path in type(self).flat_aliases.items()})
        out["model_type"] = self.model_type  # type: ignore[attr-defined]
        return out

    def to_json_string(self, use_diff: bool = True) -> str:
        """``to_dict()`` as indented JSON (``use_diff`` is accepted for transformers' signature; the full dict
        is always written)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def get(self, key: str, default: Any = None) -> Any:
        """``getattr(config, key, default)``: a field, a flat alias, or a key of the ``config.json`` dict."""
        value = getattr(self, key, _MISSING)
        if value is not _MISSING:
            return value
        return self.to_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup failed: pydantic's fields and properties come first
        aliases = type(self).flat_aliases
        if name in aliases:
            return self._read_dotted(aliases[name])
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in ("_name_or_path", "name_or_path"):
            return self._hf_extra().get("_name_or_path", "")
        if name in ("dtype", "torch_dtype"):
            return self._hf_extra().get("dtype", self._hf_extra().get("torch_dtype"))
        if name == "architectures":
            return self._hf_extra().get("architectures")  # transformers' None unless the file named one
        try:
            return super().__getattr__(name)  # type: ignore[misc]  # pydantic's (private attributes, errors)
        except AttributeError:
            raise MissingAttributeError(f"{type(self).__name__} has no attribute {name!r}") from None

    # ---------------------------------------------------------------------------------------- writing
    def __setattr__(self, name: str, value: Any) -> None:
        aliases = type(self).flat_aliases
        if name in aliases:
            self._write_dotted(aliases[name], value)
            return
        if name in ("_name_or_path", "name_or_path", "dtype", "torch_dtype"):
            # bookkeeping transformers writes onto a config; kept in the round-trip extras, never validated
            key = "_name_or_path" if name == "name_or_path" else name
            extra = dict(self._hf_extra())
            extra[key] = str(value).removeprefix("torch.") if key in ("dtype", "torch_dtype") else value
            self._atomic_set("hf", extra)
            return
        if name == "num_labels" and self._default_label_names():
            # transformers' rule: a new label count with the default names gets new default names
            self._revalidate({"num_labels": value, "id2label": None, "label2id": None})
            return
        if name in getattr(type(self), "model_fields", {}):
            self._atomic_set(name, value)
            return
        super().__setattr__(name, value)

    def _default_label_names(self) -> bool:
        id2label = self.__dict__.get("id2label")
        return isinstance(id2label, dict) and id2label == {i: f"LABEL_{i}" for i in range(len(id2label))}

    def _revalidate(self, changes: dict[str, Any]) -> None:
        """Validate the whole config with ``changes`` applied; only if that succeeds, take its values."""
        fields_set = set(self.__pydantic_fields_set__) | set(changes)  # type: ignore[attr-defined]
        new = type(self).model_validate({**self.model_dump(), **changes})  # type: ignore[attr-defined]
        self.__dict__.update(new.__dict__)
        object.__setattr__(self, "__pydantic_fields_set__", fields_set - {"id2label", "label2id"})

    def _atomic_set(self, name: str, value: Any) -> None:
        """Assign and validate; on any error restore every field (and which fields were set) as before."""
        saved = dict(self.__dict__)
        fields_set = set(self.__pydantic_fields_set__)  # type: ignore[attr-defined]
        try:
            super().__setattr__(name, value)
        except Exception:
            self.__dict__.clear()
            self.__dict__.update(saved)
            object.__setattr__(self, "__pydantic_fields_set__", fields_set)
            raise

    def _read_dotted(self, path: str) -> Any:
        node: Any = self
        for part in path.split("."):
            node = getattr(node, part)
        return node

    def _write_dotted(self, path: str, value: Any) -> None:
        """Set a nested field by rebuilding its parents (validated), then assigning the top one atomically."""
        top, *rest = path.split(".")
        if not rest:
            self._atomic_set(top, value)
            return
        data = getattr(self, top).model_dump()
        node = data
        for part in rest[:-1]:
            child = node[part]
            node[part] = child = dict(child) if isinstance(child, dict) else {"name": child}
            node = child
        node[rest[-1]] = value
        self._atomic_set(top, data)

    def _hf_extra(self) -> dict[str, Any]:
        return dict(self.__dict__.get("hf") or {})


__all__ = ["CONSTANTS", "FLAT_ALIASES", "FLAT_FIELDS", "FlatConfigView"]
