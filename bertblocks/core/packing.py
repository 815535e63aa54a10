"""Packed (unpadded) batches: the real tokens of a padded batch, laid end to end.

Shapes::

    padded  [b, L, ...]      packed  [T, ...]    T = number of real tokens (sum of the lengths)

In a packed forward pass every position-wise operation — the Q/K/V and output projections, the
feed-forward block, every LayerNorm — runs on the ``T`` real tokens only. Attention needs the sequences
apart: a backend that declares ``varlen`` gets the packed tensors with ``cu_seqlens``; any other backend
gets Q/K/V scattered back into the padded layout for that one call (its cost is ``b·L²``, small next to the
dense layers at BERT lengths), with the usual padding mask and position bias, so every backend and every
position scheme works unchanged.

Under ``torch.compile`` the token count ``T`` is data-dependent (it comes from ``nonzero``). ``nonzero`` runs
inside one custom op, ``bertblocks::real_token_index`` (:func:`real_token_index`), whose fake kernel gives the
compiler a symbolic size of its own, so packing is traced into the graph under any compile route and any
compiler settings (plain ``nonzero`` is captured only when the process-wide
``torch._dynamo.config.capture_dynamic_output_shape_ops`` is on). One graph then serves every ``T``, with no host
sync. ``max_seqlen`` is the padded length ``L`` there (an upper bound, which is all a varlen kernel needs to
size its grid), since reading the longest row would sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import torch_internals


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a right-padded ``[b, L]`` batch sit.

    Attributes:
        index: ``[T]`` flat indices (into ``b·L``) of the real tokens, row by row.
        batch, length: the padded shape ``b``, ``L``.
        cu_seqlens: ``[b + 1]`` int32 cumulative lengths (FlashAttention's varlen convention).
        max_seqlen: the longest row.
    """

    index: torch.Tensor
    batch: int
    length: int
    cu_seqlens: torch.Tensor
    max_seqlen: int
    #: compiled only: a 0-dim bool, true when the batch has no real token (position 0 then stands in, see
    #: :meth:`from_mask`, and :meth:`unpack` zeroes it again)
    empty: torch.Tensor | None = None

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> Packing:
        """Build from a ``[b, L]`` 0/1 mask."""
        b, length = attention_mask.shape
        real = attention_mask.reshape(-1).bool()
        empty = None
        if torch.compiler.is_compiling():
            # Inductor must know T >= 1 to lay out [1, T, H] tensors around frozen (pre-packed) matmul weights
            # (is T*H < H?), and a data-dependent T cannot tell it. So a batch without a single real token
            # packs position 0 anyway (decided in the graph: no branch, no sync), and unpack zeroes it again:
            # the result is eager's, zeros everywhere.
            empty = ~real.any()
            real = torch.cat([real[:1] | empty, real[1:]])
        # Row-major order keeps each row's real tokens adjacent, so cu_seqlens holds for any padding side.
        index = real_token_index(real)  # [T]
        if empty is not None:
            torch._check(index.shape[0] >= 1, lambda: "a compiled packed batch packs at least one token")
        lengths = attention_mask.sum(dim=1, dtype=torch.int32)  # [b]
        cu = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # [b + 1]
        max_seqlen = length if torch.compiler.is_compiling() else int(lengths.max())  # no sync in a graph
        return cls(index, b, length, cu, max_seqlen, empty)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, L, ...]`` → ``[T, ...]``."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, ...]`` → ``[b, L, ...]`` with zeros at padded positions."""
        out = x.new_zeros(self.batch * self.length, *x.shape[1:])
        out.index_copy_(0, self.index, x)
        if self.empty is not None:  # position 0 stood in for an empty batch (see from_mask): zero it again
            out[:1] = out[:1] * (~self.empty).to(out.dtype)
        return out.view(self.batch, self.length, *x.shape[1:])


@torch.library.custom_op("bertblocks::real_token_index", mutates_args=())
def _real_token_index(real: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool → ``[T]`` int64 positions of the true entries (``nonzero``); at least one must be true."""
    index = real.nonzero().squeeze(1)
    # the fake kernel promises T >= 1 (Packing.from_mask stands position 0 in for a batch without a real token)
    torch._check(index.shape[0] >= 1, lambda: "bertblocks::real_token_index: no true entry")
    return index


@_real_token_index.register_fake
def _real_token_index_fake(real: torch.Tensor) -> torch.Tensor:
    # A fake kernel that asks for a data-dependent size through the public `ctx.new_dynamic_size()` is refused
    # unless the *process-wide* `capture_dynamic_output_shape_ops` compiler flag is on (or the call uses
    # fullgraph=True): dynamo would then break the graph at `nonzero` and run the model padded. The size made
    # directly in the compiler's shape environment (as torch's own device-mesh op does) is the same unbacked
    # symbol `nonzero` gets under that flag, without anyone having to set it (a torch internal: see
    # bertblocks.torch_internals, whose fallback is the public call and so the graph break).
    size = torch_internals.dynamic_output_size(torch.ops.bertblocks.real_token_index.default)
    return real.new_empty((size,), dtype=torch.int64)


def real_token_index(real: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool → ``[T]`` positions of the true entries: ``nonzero``, as one custom op under ``torch.compile``
    (a symbolic ``T`` in one graph, whatever the compiler settings; see the module). An exported graph
    (``torch.export``, ONNX) keeps ``nonzero``: export captures its size itself, and ONNX has no translation of the
    custom op."""
    if torch.compiler.is_compiling() and not torch.compiler.is_exporting():
        return torch.ops.bertblocks.real_token_index(real)
    return real.nonzero().squeeze(1)


def right_padded_lengths(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """Row lengths if every row of the ``[b, L]`` mask is ones then zeros (right padding), else ``None``."""
    lengths = attention_mask.sum(dim=1)
    expected = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None, :] < lengths[:, None]
    return lengths if bool((attention_mask.bool() == expected).all()) else None
