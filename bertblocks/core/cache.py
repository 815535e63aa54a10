"""The key/value cache of a decoder: self-attention keys and values that grow with every call, and
cross-attention keys and values computed once from the encoder states and then reused.

Shapes::

    keys, values   [b, h, t, d]   t = tokens cached so far (self) or encoder length (cross)

Storage grows by doubling its capacity, so appending one token costs O(1) amortised instead of copying
the whole cache (``torch.cat``) at every step; a step reads a view of the filled part. The cache is a plain
object, never a module: its tensors cannot enter a ``state_dict``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import InputError


class _Growing:
    """One layer's self-attention keys or values with amortised O(1) appends along the time axis."""

    __slots__ = ("buffer", "capacity", "length")

    def __init__(self, first: torch.Tensor) -> None:
        self.buffer = first
        self.length = self.capacity = first.shape[2]

    def append(self, new: torch.Tensor) -> torch.Tensor:
        end = self.length + new.shape[2]
        if end > self.capacity:
            self.capacity = max(end, 2 * self.capacity)
            grown = new.new_empty(new.shape[0], new.shape[1], self.capacity, new.shape[3])
            grown[:, :, : self.length].copy_(self.buffer[:, :, : self.length])
            self.buffer = grown
        self.buffer[:, :, self.length : end].copy_(new)
        self.length = end
        return self.buffer[:, :, :end]

    def view(self) -> torch.Tensor:
        return self.buffer[:, :, : self.length]


class KVCache:
    """Keys and values of every decoder layer.

    Example:
        >>> out = model(input_ids[:, :5], use_cache=True)
        >>> step = model(input_ids[:, 5:6], past_key_values=out.past_key_values, use_cache=True)

    Attributes:
        num_layers: layers the cache holds entries for.
    """

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        #: the shape signature of the model last checked against this cache (see ``check_compatible``)
        self.signature: tuple[int, ...] | None = None
        self._keys: list[_Growing | None] = [None] * num_layers
        self._values: list[_Growing | None] = [None] * num_layers
        self._cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    # ------------------------------------------------------------------------------------ self-attention
    def get_seq_length(self) -> int:
        """Tokens cached so far (0 for an empty cache)."""
        first = self._keys[0]
        return first.length if first is not None else 0

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's ``[b, h, q, d]`` keys/values for ``layer``; return all ``[b, h, t + q, d]``."""
        k, v = self._keys[layer], self._values[layer]
        if k is None or v is None:
            _check_pair(f"layer {layer}", keys, values)  # once per layer: later appends come from the model
            self._keys[layer], self._values[layer] = _Growing(keys), _Growing(values)
            return keys, values
        return k.append(keys), v.append(values)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cached self-attention keys and values of ``layer``, if any."""
        k, v = self._keys[layer], self._values[layer]
        return (k.view(), v.view()) if k is not None and v is not None else None

    # ----------------------------------------------------------------------------------- cross-attention
    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._cross[layer]

    def set_cross(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        _check_pair(f"layer {layer} cross-attention", keys, values)
        self._cross[layer] = (keys, values)

    # ---------------------------------------------------------------------------------- whole-cache ops
    def reorder(self, beam_index: torch.Tensor) -> None:
        """Reorder the batch (beam search keeps the rows of the surviving beams)."""
        for store in (self._keys, self._values):
            for entry in store:
                if entry is not None:
                    entry.buffer = entry.buffer.index_select(0, beam_index.to(entry.buffer.device))
        self._cross = [
            None if c is None else (c[0].index_select(0, beam_index), c[1].index_select(0, beam_index))
            for c in self._cross
        ]

    def crop(self, length: int) -> None:
        """Forget every cached self-attention position from ``length`` on (negative: drop that many)."""
        current = self.get_seq_length()
        keep = current + length if length < 0 else min(length, current)
        if keep < 0:
            raise InputError(f"cannot crop {current} cached positions to {length}")
        for store in (self._keys, self._values):
            for entry in store:
                if entry is not None:
                    entry.length = keep

    def check_compatible(self, batch_size: int, shapes: Sequence[tuple[int, int]]) -> None:
        """Raise a clear ``ValueError`` if this cache was made by a model of another shape or batch.

        Args:
            batch_size: the input's rows.
            shapes: ``(heads, head_dim)`` of each layer of the model (layers may differ: per-layer overrides,
                pruning).
        """
        if self.num_layers != len(shapes):
            raise InputError(
                f"past_key_values hold {self.num_layers} layers but this model has {len(shapes)}; "
                "the cache comes from a model of another shape"
            )
        for i, (n, head_dim) in enumerate(shapes):
            entry = self.layer(i)
            if entry is None:
                continue
            b, h, _, d = entry[0].shape
            if (h, d) != (n, head_dim):
                raise InputError(
                    f"past_key_values layer {i} holds {h} heads x {d} dims but this model's layer {i} has "
                    f"{n} x {head_dim}; the cache comes from a model of another shape"
                )
            if b != batch_size:
                raise InputError(f"past_key_values hold a batch of {b} but the input has {batch_size} rows")

    # ------------------------------------------------------------------------------ transformers 4.x form
    def to_legacy(self) -> tuple[tuple[torch.Tensor, ...], ...]:
        """transformers 4.x nested tuples: per layer ``(k, v)`` or ``(k, v, cross_k, cross_v)``."""
        out = []
        for i in range(self.num_layers):
            entry = self.layer(i)
            if entry is None:
                raise InputError(f"layer {i} has no cached keys")
            cross = self._cross[i]
            out.append(entry + cross if cross is not None else entry)
        return tuple(out)

    @classmethod
    def from_legacy(cls, legacy: Sequence[Sequence[torch.Tensor]]) -> KVCache:
        """Read transformers 4.x nested tuples (see :meth:`to_legacy`)."""
        cache = cls(len(legacy))
        for i, entry in enumerate(legacy):
            if len(entry) not in (2, 4):
                raise InputError(f"past_key_values[{i}] has {len(entry)} tensors; expected (k, v) or (k, v, ck, cv)")
            cache.update(i, entry[0], entry[1])
            if len(entry) == 4:
                cache.set_cross(i, entry[2], entry[3])
        return cache


def _check_pair(where: str, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Keys and values of one layer must agree in batch, heads and length (``[b, h, t, d]``): a cache built
    by hand (or from transformers 4.x tuples) that does not would otherwise attend to keys without values."""
    if keys.dim() != 4 or values.dim() != 4:
        raise InputError(
            f"past_key_values {where}: keys and values must be 4-D [batch, heads, length, head_dim]; got "
            f"{tuple(keys.shape)} and {tuple(values.shape)}"
        )
    if keys.shape[:3] != values.shape[:3]:
        raise InputError(
            f"past_key_values {where}: keys {tuple(keys.shape)} and values {tuple(values.shape)} disagree in "
            "batch, heads or length ([batch, heads, length, head_dim])"
        )
