"""Varlen attention with PyTorch's ``flex_attention``: all packed sequences in one call, a document mask between them.

The packed tokens ``[T, h, d]`` attend as one ``[1, h, T, d]`` batch whose block mask lets a query see only the keys
of its own sequence (its *document*). A fused flex kernel skips the hidden blocks, so the work is about ``Σ lᵢ²``
(rounded up to the kernel's blocks), in one launch however many sequences there are: what a GPU wants, where one
launch per sequence (:mod:`bertblocks.plugins.varlen.sdpa`, the reference) leaves most of the device idle.

Which varlen kernel runs where is decided in :mod:`bertblocks.plugins.varlen.kernels` (measured there: flex is
chosen only by name). On CPU ``varlen_kernel: flex`` runs uncompiled, materialising the whole ``[T, T]`` score
matrix: the same interface, so the CPU tests check its numbers against the per-sequence path.

Score modifications: :func:`flex_varlen_attention` takes a ``score_mod`` factory, called with the packed batch's
:class:`PackedIndex` (each token's sequence and its position within it, from 0), that returns a flex ``score_mod``
``(score, b, h, q_idx, kv_idx) → score``. A score-bias position scheme (ALiBi's ``-slope[h]·|i - j|``, BERT's
``relative_key`` terms) could run packed through this kernel; no built-in scheme passes one: on CPU the packed
path's per-sequence calls with each sequence's term as the mask measured 11-26× faster than uncompiled flex with an
ALiBi ``score_mod`` (``benchmarks/bench_varlen.py --score-bias``, docs/explanation/packing.md), and inside a compiled
graph the custom op of :mod:`bertblocks.plugins.varlen.biased` 2.2x faster than flex compiled with that ``score_mod``.

Where flex cannot serve a call (:func:`flex_serves`) the per-sequence kernel runs it (the ``flex`` entry of
:mod:`bertblocks.plugins.varlen.kernels`): attention dropout (flex has none), gradients on CPU (flex has no CPU
backward), heads narrower than 16 on a GPU (its Triton kernel's minimum), and inside a compiled graph.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import torch

#: flex's score modification: ``(score, batch, head, q_idx, kv_idx) → score`` (0-dim tensors)
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class PackedIndex:
    """Per packed token: which sequence it belongs to and its position there (a flex ``score_mod`` indexes both
    with ``q_idx`` and ``kv_idx``).

    Attributes:
        document: ``[T]`` int32, the sequence of each token (0 … n - 1).
        position: ``[T]`` int32, the token's position within its sequence (from 0).
    """

    document: torch.Tensor
    position: torch.Tensor

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor, tokens: int) -> PackedIndex:
        """From ``cu_seqlens [n + 1]`` for ``tokens`` packed tokens."""
        index = torch.arange(tokens, device=cu_seqlens.device, dtype=torch.int32)
        cu = cu_seqlens.to(device=index.device, dtype=torch.int32)
        document = torch.searchsorted(cu[1:], index, right=True).to(torch.int32)  # [T]
        return cls(document, index - cu[document.long()])


#: a factory of a flex ``score_mod`` for one packed batch
PackedScoreMod = Callable[[PackedIndex], ScoreMod]


def flex_available() -> bool:
    """Whether this torch has ``torch.nn.attention.flex_attention`` (2.5 and later)."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


class _LastBlockMask:
    """The block mask of the last packed batch: every layer of one forward pass gets the same ``cu_seqlens``
    tensor (one :class:`~bertblocks.core.packing.Packing`), so the mask is built once per pass, not per layer.
    Held by a weak reference to that tensor, so a later batch (a new tensor) never reuses it; the entry is one
    tuple, read and replaced whole, so two threads never mix two batches' entries."""

    def __init__(self) -> None:
        self.entry: tuple[weakref.ref[torch.Tensor], int, Any, PackedIndex] | None = None

    def get(self, cu_seqlens: torch.Tensor, tokens: int) -> tuple[Any, PackedIndex]:
        entry = self.entry
        if entry is not None and entry[0]() is cu_seqlens and entry[1] == tokens:
            return entry[2], entry[3]
        from torch.nn.attention.flex_attention import create_block_mask

        index = PackedIndex.from_cu_seqlens(cu_seqlens, tokens)
        document = index.document

        def same_sequence(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            return document[q_idx] == document[kv_idx]

        block_mask = create_block_mask(same_sequence, None, None, tokens, tokens, device=cu_seqlens.device)
        self.entry = (weakref.ref(cu_seqlens), tokens, block_mask, index)
        return block_mask, index


_block_masks = _LastBlockMask()
_compiled_flex: Callable[..., torch.Tensor] | None = None


def _flex_kernel(device: torch.device) -> Callable[..., torch.Tensor]:
    """Compiled flex on an accelerator (the fused kernel); the uncompiled one on CPU (see the module)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if device.type == "cpu":
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex


def flex_varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    *,
    score_mod: PackedScoreMod | None = None,
) -> torch.Tensor:
    """``[T, h, d]`` each → ``[T, h, d]``: attention within each ``cu_seqlens`` span, in one flex call.

    Args:
        query, key, value: the packed heads (keys and values already shared out to every query head).
        cu_seqlens: ``[n + 1]`` cumulative lengths; tokens past ``cu_seqlens[-1]`` must not exist.
        scale: the softmax scale (``1/√d``).
        score_mod: builds a flex ``score_mod`` from the batch's :class:`PackedIndex` (a score bias by position).
    """
    import warnings

    tokens = query.shape[0]
    block_mask, index = _block_masks.get(cu_seqlens, tokens)
    q, k, v = (x.transpose(0, 1)[None] for x in (query, key, value))  # [1, h, T, d]
    kernel = _flex_kernel(query.device)
    with warnings.catch_warnings():
        # the uncompiled CPU kernel warns that it is unfused: it is chosen on purpose (varlen_kernel: flex on CPU)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out = kernel(
            q, k, v, score_mod=None if score_mod is None else score_mod(index), block_mask=block_mask, scale=scale
        )
    return out[0].transpose(0, 1)  # [T, h, d]


#: the smallest head size flex's GPU kernel takes (Inductor's Triton template: ``tl.dot`` needs 16)
MIN_GPU_HEAD_DIM = 16


def flex_serves(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """Whether flex can run this call: not with attention dropout (flex has none), not inside a compiled graph (the
    varlen custom op is the traced path there), not for gradients on CPU (flex has no CPU backward), and on a GPU
    not for heads narrower than :data:`MIN_GPU_HEAD_DIM`."""
    if dropout_p > 0.0 or torch.compiler.is_compiling():
        return False
    if query.device.type == "cpu":
        return not (torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)))
    return min(query.shape[-1], value.shape[-1]) >= MIN_GPU_HEAD_DIM
