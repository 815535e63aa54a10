"""Varlen attention with PyTorch's ``scaled_dot_product_attention``: one unmasked call per packed sequence.

A packed batch (see :mod:`bertblocks.core.packing`) could be re-padded to ``[b, h, L, L]`` and masked, but that
costs ``b·L²`` and, on CPU, a masked SDPA call is several times slower than unmasked ones over the same
tokens. Per sequence, the work is ``Σ lᵢ²`` and no mask is needed (bert-base, lengths
``[128, 20, 35, 64, 16, 90, 12, 48]``: 22.6 ms a layer re-padded, 4.0 ms per sequence, 1 thread); sequences of
equal length next to each other share one batched call.

Eagerly the loop runs in Python (autograd and dropout as usual). Under ``torch.compile`` the token count is
symbolic and the number of sequences is data, so the loop cannot be traced: it runs inside the custom op
``bertblocks::sdpa_varlen``, which the graph sees as one call ``[T, h, d]`` → ``[T, h, d]``. Its backward is a
second op that recomputes the probabilities per sequence; dropout cannot be recomputed identically, so compiled
training with attention dropout stays on the re-padded path (:meth:`SdpaBackend.accepts_varlen`).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from ...errors import InputError


def equal_length_runs(cu_seqlens: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(start, count, length)`` for each run of consecutive non-empty sequences of one length.

    Sequences of equal length attend as one batched call ``[count, h, length, d]`` (no mask is needed); a
    length-sorted batch (``sentence.encode``) or an unpadded one then costs a few calls, not one per sequence.
    """
    bounds = cu_seqlens.tolist()
    runs: list[tuple[int, int, int]] = []
    for start, stop in itertools.pairwise(bounds):
        length = stop - start
        if length == 0:
            continue
        if runs and runs[-1][2] == length:  # spans are contiguous: an empty row in between adds no token
            first, count, _ = runs[-1]
            runs[-1] = (first, count + 1, length)
        else:
            runs.append((start, 1, length))
    return runs


def run_heads(x: torch.Tensor, start: int, count: int, length: int) -> torch.Tensor:
    """The run's tokens of packed ``[T, h, ·]`` as ``[count, h, length, ·]`` (a view)."""
    return x[start : start + count * length].unflatten(0, (count, length)).transpose(1, 2)


def run_tokens(x: torch.Tensor) -> torch.Tensor:
    """``[count, h, length, ·]`` → ``[count·length, h, ·]``."""
    return x.transpose(1, 2).flatten(0, 1)


def sdpa_per_sequence(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``[T, h, d]`` each → ``[T, h, d]``: attention within each ``cu_seqlens`` span, no mask.

    Tokens past ``cu_seqlens[-1]`` (a compiled empty batch packs one stand-in token) get zeros.
    """
    runs = equal_length_runs(cu_seqlens)  # the one read of cu_seqlens from the host
    covered = runs[-1][0] + runs[-1][1] * runs[-1][2] if runs else 0
    out = torch.zeros_like(query) if covered < query.shape[0] else torch.empty_like(query)
    for start, count, length in runs:
        q, k, v = (run_heads(x, start, count, length) for x in (query, key, value))
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
        out[start : start + count * length] = run_tokens(attended)
    return out


@torch.library.custom_op("bertblocks::sdpa_varlen", mutates_args=())
def sdpa_varlen(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor, scale: float
) -> torch.Tensor:
    """The compiled graph's varlen attention (no dropout): :func:`sdpa_per_sequence` as one opaque op."""
    return sdpa_per_sequence(query, key, value, cu_seqlens, scale)


@sdpa_varlen.register_fake
def _sdpa_varlen_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor, scale: float
) -> torch.Tensor:
    return torch.empty_like(query, memory_format=torch.contiguous_format)


@torch.library.custom_op("bertblocks::sdpa_varlen_backward", mutates_args=())
def sdpa_varlen_backward(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`sdpa_varlen` for ``query``, ``key``, ``value``, written out per sequence.

    (A custom op's kernel runs below autograd, so it cannot differentiate the forward again; the formulas are
    softmax attention's: with ``P = softmax(scale·QKᵀ)``, ``dV = Pᵀ·dO``, ``dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))``,
    ``dQ = scale·dS·K``, ``dK = scale·dSᵀ·Q``.)
    """
    gq, gk, gv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    for start, count, length in equal_length_runs(cu_seqlens):
        q, k, v, do = (run_heads(x, start, count, length) for x in (query, key, value, grad))  # [n, h, l, d]
        dq, dk, dv, _ = attention_grads(q, k, v, do, scale)
        run = slice(start, start + count * length)
        gq[run], gk[run], gv[run] = run_tokens(dq), run_tokens(dk), run_tokens(dv)
    return gq, gk, gv


def attention_grads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, scale: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dQ, dK, dV`` and ``dS`` of ``O = softmax(scale·QKᵀ + M)·V`` for ``dO`` (``[n, h, l, d]`` each; ``dS``
    ``[n, h, l, l]`` is also ``dM``): ``dV = Pᵀ·dO``, ``dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))``, ``dQ = scale·dS·K``,
    ``dK = scale·dSᵀ·Q``. The backward of both compiled varlen ops (this module's and
    :mod:`~bertblocks.plugins.varlen.biased`'s)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    probs = torch.softmax(scores if mask is None else scores + mask, dim=-1)
    out = torch.matmul(probs, v)
    d_scores = probs * (torch.matmul(do, v.transpose(-1, -2)) - (do * out).sum(-1, keepdim=True))
    dq = torch.matmul(d_scores, k) * scale
    dk = torch.matmul(d_scores.transpose(-1, -2), q) * scale
    return dq, dk, torch.matmul(probs.transpose(-1, -2), do), d_scores


@sdpa_varlen_backward.register_fake
def _sdpa_varlen_backward_fake(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (query, key, value))  # type: ignore[return-value]


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
    query, key, value, cu_seqlens, scale = inputs
    ctx.save_for_backward(query, key, value, cu_seqlens)
    ctx.scale = scale  # type: ignore[attr-defined]


def _backward(
    ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
    query, key, value, cu_seqlens = ctx.saved_tensors  # type: ignore[attr-defined]
    gq, gk, gv = sdpa_varlen_backward(grad.contiguous(), query, key, value, cu_seqlens, ctx.scale)  # type: ignore[attr-defined]
    return gq, gk, gv, None, None


sdpa_varlen.register_autograd(_backward, setup_context=_setup_context)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    dropout_p: float,
) -> torch.Tensor:
    """Eager: the Python loop; compiled: the custom op (which takes no dropout, see the module)."""
    if torch.compiler.is_compiling():
        if dropout_p > 0.0:
            raise InputError("compiled varlen attention takes no dropout (SdpaBackend.accepts_varlen says so)")
        return torch.ops.bertblocks.sdpa_varlen(query, key, value, cu_seqlens, scale)
    return sdpa_per_sequence(query, key, value, cu_seqlens, scale, dropout_p)
