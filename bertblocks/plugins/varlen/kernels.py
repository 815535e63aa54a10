"""The varlen kernels of the ``sdpa`` backend by name, and which one ``varlen_kernel: auto`` runs per device type.

A varlen kernel attends a packed batch: ``(query, key, value [T, h, d], cu_seqlens [n + 1], scale, dropout_p,
max_seqlen) → [T, h, d]``, each token seeing only the keys of its own sequence.

* ``per_sequence`` (:mod:`bertblocks.plugins.varlen.sdpa`): one unmasked SDPA call per run of equal lengths;
* ``flex`` (:mod:`bertblocks.plugins.varlen.flex`): one ``flex_attention`` call with a document block mask;
* ``flash`` (:mod:`bertblocks.plugins.varlen.flash`): FlashAttention's varlen kernel on a CUDA GPU.

``auto`` is decided once, when the backend is built (:func:`varlen_kernels`):

* ``cuda``: ``flash`` (the re-padded masked call where FlashAttention cannot serve). Measured on an H100
  (docs/explanation/performance.md, "GPU"): a packed bert-base encoder took 0.52x the per-sequence calls' time with
  it, 1.46x with flex (its compiled kernel is fast, but building the block mask per batch costs more than the
  attention);
* ``cpu``: ``per_sequence``. Measured on CPU (``benchmarks/bench_varlen.py``): flex's compiled CPU kernel is slower
  than per-sequence SDPA at BERT lengths, its block mask adds a cost per batch, and uncompiled it materialises the
  whole ``[T, T]`` score matrix (tens of times slower).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from ...errors import InputError
from .flash import flash_available, flash_varlen_attention
from .flex import flex_available, flex_serves, flex_varlen_attention
from .sdpa import varlen_attention

#: a varlen kernel: ``(query, key, value [T, h, d], cu_seqlens [n + 1], scale, dropout_p, max_seqlen) → [T, h, d]``
VarlenKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, float, int], torch.Tensor]
#: what ``varlen_kernel`` may name
VarlenKernelName = Literal["auto", "per_sequence", "flex", "flash"]


def _per_sequence(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    dropout_p: float,
    max_seqlen: int,
) -> torch.Tensor:
    return varlen_attention(query, key, value, cu_seqlens, scale, dropout_p)


def _flex_or_per_sequence(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    dropout_p: float,
    max_seqlen: int,
) -> torch.Tensor:
    """Flex, except where it cannot serve the call (:func:`~bertblocks.plugins.varlen.flex.flex_serves`): the
    per-sequence kernel then."""
    if not flex_serves(query, key, value, dropout_p):
        return varlen_attention(query, key, value, cu_seqlens, scale, dropout_p)
    return flex_varlen_attention(query, key, value, cu_seqlens, scale)


#: the kernels by name
KERNELS: dict[str, VarlenKernel] = {
    "per_sequence": _per_sequence,
    "flex": _flex_or_per_sequence,
    "flash": flash_varlen_attention,
}


def varlen_kernels(choice: VarlenKernelName) -> dict[str, str]:
    """The varlen kernel per device type, decided at build time: ``auto`` is FlashAttention's varlen kernel on
    CUDA and the per-sequence SDPA calls on CPU (see the module); a name is that kernel everywhere.

    Raises:
        InputError: ``flex`` asked for on a torch without ``flex_attention``.
    """
    if choice == "flex" and not flex_available():
        raise InputError(
            f"varlen_kernel: flex needs torch.nn.attention.flex_attention (torch 2.5+; this is {torch.__version__})"
        )
    if choice == "auto":
        return {"cpu": "per_sequence", "cuda": "flash" if flash_available() else "per_sequence"}
    return {"cpu": choice, "cuda": choice}
