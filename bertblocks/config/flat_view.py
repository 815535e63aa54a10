"""The flat, dict-like face of a config that the Hugging Face ecosystem reads.

Trainer, PEFT, accelerate, pipelines and sentence-transformers read a model's config as transformers'
configs look: ``config.model_type``, ``config.num_hidden_layers``, ``config.to_dict()``,
``config.get("tie_word_embeddings")``, ``config.use_return_dict`` … This mixin gives a pydantic config that
face without changing what it is: every alias reads (and, where it names a real field, writes) the nested
field it stands for, so there is one source of truth, and writes are validated like any other assignment.

Assignments are atomic: a value the config rejects (a field validator *or* a whole-config validator) leaves
the config exactly as it was, unlike pydantic's own ``validate_assignment``, which has already stored the
value when a model-level validator refuses it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

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
    """Mixin for a pydantic config: transformers' flat attribute names, ``to_dict``/``get``/``save_pretrained``,
    and atomic validated assignment.

    A class using it defines ``to_hf()`` (the flat ``config.json`` dict).
    """

    #: transformers' attribute names that read the nested field they name (see :data:`FLAT_ALIASES`)
    flat_aliases: ClassVar[dict[str, str]] = FLAT_ALIASES

    # ------------------------------------------------------------------------------- dict-like reading
    @property
    def model_type(self) -> str:
        """``config.json``'s ``model_type``: the checkpoint format's name for this architecture."""
        return str(self.to_hf().get("model_type", ""))

    def to_hf(self) -> dict[str, Any]:  # pragma: no cover - provided by the config class
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The flat ``config.json`` dict, as transformers' ``PretrainedConfig.to_dict`` returns it."""
        return self.to_hf()

    def to_json_string(self, use_diff: bool = True) -> str:
        """``to_dict()`` as indented JSON (``use_diff`` is accepted for transformers' signature; the full dict
        is always written)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, json_file_path: str | Path, use_diff: bool = True) -> None:
        Path(json_file_path).write_text(self.to_json_string(use_diff), encoding="utf-8")

    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> None:
        """Write ``config.json`` into ``save_directory`` (created if needed)."""
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.to_json_file(directory / "config.json")

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
            return self.to_hf().get("architectures")
        try:
            return super().__getattr__(name)  # type: ignore[misc]  # pydantic's (private attributes, errors)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}") from None

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


__all__ = ["CONSTANTS", "FLAT_ALIASES", "FlatConfigView"]
