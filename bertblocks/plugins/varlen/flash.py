"""Varlen attention with FlashAttention's variable-length kernel (``torch.nn.attention.varlen.varlen_attn``).

On a CUDA GPU, every packed sequence of a batch attends in one launch, addressed by ``cu_seqlens``: no mask, no
padding, no block mask to build, and a backward of its own. It is the kernel the packed path was built for on a
GPU. Measured on an H100 (``benchmarks/bench_gpu.py``, ``benchmarks/bench_varlen.py --device cuda``, figures in
docs/explanation/performance.md): the per-sequence SDPA calls launch a kernel per run of equal lengths in every
layer, and flex_attention builds a block mask per batch; both left a padded bert-base batch slower packed than
transformers' padded SDPA call.

FlashAttention computes in float16 / bfloat16 only and has no dropout. Where it cannot serve a call
(:func:`flash_serves`: float32, attention dropout, heads wider than 256, a torch without ``varlen_attn``) on a GPU,
the call is re-padded inside the kernel and attends in one masked SDPA launch (:func:`repadded_varlen_attention`,
which takes dropout); on a CPU and inside a compiled graph the per-sequence SDPA calls run it (the custom op
``bertblocks::sdpa_varlen`` is the traced path there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .sdpa import varlen_attention

#: the head sizes FlashAttention takes (its kernels are built up to 256, in steps of 8)
MAX_HEAD_DIM = 256
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _varlen_attn() -> Callable[..., torch.Tensor] | None:
    """``torch.nn.attention.varlen.varlen_attn`` where this torch has it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def flash_available() -> bool:
    """Whether this torch has the varlen FlashAttention entry point."""
    return _varlen_attn() is not None


def flash_serves(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """Whether FlashAttention's varlen kernel can run this call: a CUDA tensor in float16 / bfloat16, no attention
    dropout, not inside a compiled graph, query/key/value heads of one size up to :data:`MAX_HEAD_DIM` (a multiple
    of 8), one key head per query head."""
    if dropout_p > 0.0 or torch.compiler.is_compiling() or query.device.type != "cuda":
        return False
    if query.dtype not in HALF_DTYPES or not (query.dtype == key.dtype == value.dtype):
        return False
    d = query.shape[-1]
    same = key.shape[-1] == d and value.shape[-1] == d and key.shape[-2] == query.shape[-2]
    return same and d <= MAX_HEAD_DIM and d % 8 == 0 and flash_available()


def flash_varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    dropout_p: float,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """``[T, h, d]`` each → ``[T, h, d]``: attention within each ``cu_seqlens`` span, one FlashAttention launch;
    the per-sequence SDPA calls where FlashAttention cannot serve (:func:`flash_serves`).

    ``max_seqlen`` is the longest span (the packing knows it on the host); ``None`` reads it from ``cu_seqlens``
    (a device sync). Every token lies in a span (an eager packed batch: the compiled one never comes here).
    """
    varlen_attn = _varlen_attn()
    if varlen_attn is None or not flash_serves(query, key, value, dropout_p):
        if query.device.type == "cuda" and not torch.compiler.is_compiling():
            # one masked launch, not one per run of equal lengths: a packed bert-base fine-tuning step with
            # attention dropout ran 4x slower than transformers' padded one on the per-sequence calls (an H100)
            return repadded_varlen_attention(query, key, value, cu_seqlens, scale, dropout_p, max_seqlen)
        return varlen_attention(query, key, value, cu_seqlens, scale, dropout_p)
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
    if max_seqlen == 0:
        return torch.zeros_like(query)
    cu = cu_seqlens.to(device=query.device, dtype=torch.int32)
    return varlen_attn(query, key, value, cu, cu, max_seqlen, max_seqlen, scale=scale)


def repadded_varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    dropout_p: float,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """``[T, h, d]`` each → ``[T, h, d]``: the packed sequences re-padded to ``[n, h, L, d]`` and attended in one
    masked SDPA call (dropout included), their tokens gathered back. Every token lies in a span.

    The GPU's fallback where FlashAttention cannot serve: one launch per layer, where the per-sequence calls launch
    one per run of equal lengths. (On a CPU the per-sequence calls are faster: a masked call costs ``n·L²``.)
    """
    tokens = query.shape[0]
    n = cu_seqlens.numel() - 1
    cu = cu_seqlens.to(device=query.device, dtype=torch.long)
    if max_seqlen is None:
        max_seqlen = int((cu[1:] - cu[:-1]).max()) if n > 0 else 0
    if tokens == 0 or max_seqlen == 0:
        return torch.zeros_like(query)
    index = torch.arange(tokens, device=query.device)
    sequence = torch.searchsorted(cu[1:], index, right=True)  # [T]
    position = index - cu[sequence]

    def padded(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(n, max_seqlen, x.shape[1], x.shape[2])
        out[sequence, position] = x
        return out.transpose(1, 2)  # [n, h, L, d]

    # keys past a sequence's end are hidden; an empty sequence keeps its first key visible (its queries are never
    # read) so that no row of the softmax is all masked
    lengths = (cu[1:] - cu[:-1]).clamp(min=1)
    visible = torch.arange(max_seqlen, device=query.device)[None, :] < lengths[:, None]  # [n, L]
    out = torch.nn.functional.scaled_dot_product_attention(
        padded(query), padded(key), padded(value), attn_mask=visible[:, None, None, :], dropout_p=dropout_p, scale=scale
    )
    return out.transpose(1, 2)[sequence, position]  # [T, h, d]
