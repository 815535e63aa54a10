"""Output containers readable by attribute, key and index, like transformers' ``ModelOutput``.

``out.last_hidden_state``, ``out["last_hidden_state"]`` and ``out[0]`` are the same tensor. Indexing by
position skips fields that are ``None``, exactly as transformers does, so code written against
``model(...)[0]`` keeps working.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import MissingKeyError


@dataclass
class ModelOutput:
    """Base of every output type: a dataclass that also behaves like an ordered mapping and a tuple.

    Every subclass is registered as a pytree node (the fields that are set are its children), so
    ``torch.export``, the ONNX exporter, ``torch.compile`` and DDP see the tensors inside an output.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _register_pytree_node(cls)

    def to_tuple(self) -> tuple[Any, ...]:
        """The non-``None`` fields in declaration order (what ``return_dict=False`` returns), then any keys set
        with ``out[key] = value`` that are not fields (as transformers' outputs, which are dicts, keep them)."""
        own = tuple(v for v in (getattr(self, f.name) for f in fields(self)) if v is not None)
        return own + tuple(self._extra().values())

    def keys(self) -> list[str]:
        """Names of the fields that are set (not ``None``), then of extra keys (see :meth:`__setitem__`)."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None] + list(self._extra())

    def __setitem__(self, key: str, value: Any) -> None:
        """``out["logits"] = t`` sets the field; another key is kept beside the fields (transformers' pipelines
        add ``input_ids`` to a model's output this way)."""
        if key in {f.name for f in fields(self)}:
            setattr(self, key, value)
        else:
            self.__dict__.setdefault("_extra_items", {})[key] = value

    def _extra(self) -> dict[str, Any]:
        return self.__dict__.get("_extra_items", {})

    def values(self) -> list[Any]:
        return [getattr(self, k) for k in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise MissingKeyError(f"{type(self).__name__} has no field {key!r} set; set fields: {self.keys()}")
            return self._extra()[key] if key in self._extra() else getattr(self, key)
        return self.to_tuple()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


def _register_pytree_node(cls: type[ModelOutput]) -> None:
    """Register ``cls`` with torch's pytree: flattened into the fields that are set, in declaration order (as
    transformers flattens its outputs; extra keys set with ``out[key] = value`` are not part of the tree)."""

    def flatten(output: ModelOutput) -> tuple[list[Any], tuple[str, ...]]:
        names = tuple(f.name for f in fields(output) if getattr(output, f.name) is not None)
        return [getattr(output, name) for name in names], names

    def flatten_with_keys(output: ModelOutput) -> tuple[list[tuple[Any, Any]], tuple[str, ...]]:
        values, names = flatten(output)
        return [(pytree.MappingKey(name), value) for name, value in zip(names, values, strict=True)], names

    def unflatten(values: Iterable[Any], names: tuple[str, ...]) -> ModelOutput:
        return cls(**dict(zip(names, values, strict=True)))

    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
    )


@dataclass
class EncoderOutput(ModelOutput):
    """What the encoder stack returns.

    Attributes:
        last_hidden_state: ``[batch, seq, hidden]`` output of the last layer.
        past_key_values: the key/value cache, when the model caches.
        hidden_states: ``num_layers + 1`` tensors, embeddings first, when asked for.
        attentions: per-layer attention probabilities ``[batch, heads, q, k]``, when asked for.
        cross_attentions: per-layer cross-attention probabilities, decoders only.
    """

    last_hidden_state: torch.Tensor | None = None
    past_key_values: Any = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class ModelOutputWithPooling(ModelOutput):
    """What the backbone returns; the fields of transformers'
    ``BaseModelOutputWithPoolingAndCrossAttentions`` in the same order."""

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    past_key_values: Any = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None


# ------------------------------------------------------------------------------------------ task heads
# transformers' output types of the BERT task models: the same names, fields and field order, so that
# `out.logits`, `out["loss"]` and `out[0]` read as they do with transformers.


@dataclass
class MaskedLMOutput(ModelOutput):
    """Masked LM: ``logits [b, q, vocab]``; ``loss`` = cross-entropy over labels that are not -100."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class CausalLMOutputWithCrossAttentions(ModelOutput):
    """Causal LM: ``logits [b, q, vocab]``; ``loss`` predicts token ``i + 1`` from position ``i``."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    past_key_values: Any = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class NextSentencePredictorOutput(ModelOutput):
    """Next-sentence prediction: ``logits [b, 2]`` (0 = B continues A, 1 = B is random)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class BertForPreTrainingOutput(ModelOutput):
    """Pre-training: masked-LM ``prediction_logits [b, q, vocab]`` and NSP ``seq_relationship_logits [b, 2]``;
    ``loss`` is their sum."""

    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class SequenceClassifierOutput(ModelOutput):
    """Sequence classification or regression: ``logits [b, num_labels]``."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class TokenClassifierOutput(ModelOutput):
    """Token classification: ``logits [b, q, num_labels]``."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class MultipleChoiceModelOutput(ModelOutput):
    """Multiple choice: ``logits [b, choices]``; hidden states and attentions are per flattened choice."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class QuestionAnsweringModelOutput(ModelOutput):
    """Extractive QA: ``start_logits`` and ``end_logits``, each ``[b, q]``."""

    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


# ------------------------------------------------------------------------------------------ retrieval heads
# bertblocks' own output types (transformers has no retrieval heads): the field names are documented in
# docs/how-to/task-heads.md ("Retrieval heads").


@dataclass
class SparseEmbeddingOutput(ModelOutput):
    """SPLADE: ``sparse_embedding [b, vocab]``, one non-negative weight per vocabulary entry (mostly zeros)."""

    loss: torch.Tensor | None = None
    sparse_embedding: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class MultiVectorOutput(ModelOutput):
    """ColBERT: ``token_embeddings [b, q, dim]`` (L2-normalised, zeros at padding) and ``token_mask [b, q]``
    (1 = a real token's vector)."""

    loss: torch.Tensor | None = None
    token_embeddings: torch.Tensor | None = None
    token_mask: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class BGEM3Output(ModelOutput):
    """BGE-M3's three outputs: ``dense_embedding [b, H]`` (normalised), ``sparse_embedding [b, vocab]`` (lexical
    weights), ``colbert_embedding [b, q - 1, H]`` (normalised, zeros at padding) and ``colbert_mask [b, q - 1]``."""

    loss: torch.Tensor | None = None
    dense_embedding: torch.Tensor | None = None
    sparse_embedding: torch.Tensor | None = None
    colbert_embedding: torch.Tensor | None = None
    colbert_mask: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
