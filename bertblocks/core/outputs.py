"""Output containers readable by attribute, key and index, like transformers' ``ModelOutput``.

``out.last_hidden_state``, ``out["last_hidden_state"]`` and ``out[0]`` are the same tensor. Indexing by
position skips fields that are ``None``, exactly as transformers does, so code written against
``BertModel(...)[0]`` keeps working.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass
class ModelOutput:
    """Base of every output type: a dataclass that also behaves like an ordered mapping and a tuple."""

    def to_tuple(self) -> tuple[Any, ...]:
        """The non-``None`` fields in declaration order (what ``return_dict=False`` returns)."""
        return tuple(v for v in (getattr(self, f.name) for f in fields(self)) if v is not None)

    def keys(self) -> list[str]:
        """Names of the fields that are set (not ``None``)."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, k) for k in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(f"{type(self).__name__} has no field {key!r} set; set fields: {self.keys()}")
            return getattr(self, key)
        return self.to_tuple()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


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
    """What :class:`bertblocks.BertModel` returns; the fields of transformers'
    ``BaseModelOutputWithPoolingAndCrossAttentions`` in the same order."""

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    past_key_values: Any = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
