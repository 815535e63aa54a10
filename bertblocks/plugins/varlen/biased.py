"""Varlen attention with a score term per sequence, as one custom op a compiled graph can hold.

Eagerly, a packed batch of a score-bias position scheme attends sequence by sequence in Python
(``BertAttention._attend_per_sequence``), each run of equal lengths one backend call with its own term as the mask.
Under ``torch.compile`` that loop cannot be traced (the number of sequences and their lengths are data), so the
graph used to re-pad. ``bertblocks::sdpa_varlen_biased`` runs the same loop inside one opaque op
``[T, h, d]`` → ``[T, h, d]``, with the term handed over in a form whose shapes the graph knows
(:class:`~bertblocks.core.interfaces.PackedScoreTerm`): entry ``(i, j)`` of the term of the sequence packed from
token ``s`` on is ::

    term_scale · (rows[s + i, h, index[i, j]] + cols[s + j, h, index[i, j]]) + fixed[0, h, i, j]

``rows``/``cols`` ``[T, h, N]`` are per-token products with a position table (``relative_key``'s ``q · E``, DeBERTa's
``query · P_k`` and ``key · P_q``), computed by the graph before the op, so that their gradients reach the table and
the projections through the graph's own autograd (``term_scale``, the softmax scale that HF applies to such terms,
is taken inside the op: a scaled copy outside would hand inductor a data-sized view it cannot lay out for the
table's gradient); ``index`` ``[L, L]`` picks each pair's table row; ``fixed``
``[1, h, L, L]`` is a term of the positions alone (ALiBi), whose top-left ``[l, l]`` is a right-padded sequence's.
Each is optional. The op's backward (a second op, recomputing the probabilities per run) returns the gradients of
the queries, keys, values and of each of the three terms: ``dScores`` scattered back into ``rows``/``cols`` at the
gathered entries, and summed into ``fixed``'s corner. Dropout cannot be recomputed identically, so compiled training
with attention dropout stays re-padded (as :mod:`bertblocks.plugins.varlen.sdpa`'s op).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import InputError
from .sdpa import attention_grads, equal_length_runs, run_heads, run_tokens


def _pairs(index: torch.Tensor | None, length: int) -> torch.Tensor:
    """The ``[length, length]`` table rows the pairs of a sequence read: table products need their index."""
    if index is None:
        raise InputError("sdpa_varlen_biased: rows or cols given without the index of the rows each pair reads")
    return index[:length, :length]


def run_mask(
    start: int,
    count: int,
    length: int,
    term_scale: float,
    index: torch.Tensor | None,
    rows: torch.Tensor | None,
    cols: torch.Tensor | None,
    fixed: torch.Tensor | None,
) -> torch.Tensor | None:
    """The additive mask ``[count|1, h, length, length]`` of one run of equal-length sequences (see the module)."""
    mask = None
    if rows is not None or cols is not None:
        h = (rows if rows is not None else cols).shape[1]  # type: ignore[union-attr]
        pairs = _pairs(index, length)
        if rows is not None:
            mask = torch.gather(run_heads(rows, start, count, length), -1, pairs.expand(count, h, length, length))
        if cols is not None:
            # entry (i, j) reads key j's row index[i, j]: gathered down the keys, then turned to [i, j]
            by_key = torch.gather(run_heads(cols, start, count, length), -1, pairs.T.expand(count, h, length, length))
            mask = by_key.transpose(-1, -2) if mask is None else mask + by_key.transpose(-1, -2)
        mask = mask * term_scale
    if fixed is not None:
        corner = fixed[:, :, :length, :length]
        mask = corner if mask is None else mask + corner
    return mask


def biased_per_sequence(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    term_scale: float,
    index: torch.Tensor | None,
    rows: torch.Tensor | None,
    cols: torch.Tensor | None,
    fixed: torch.Tensor | None,
) -> torch.Tensor:
    """``[T, h, d]`` each → ``[T, h, d]``: attention within each ``cu_seqlens`` span, its term as the mask.

    Tokens past ``cu_seqlens[-1]`` (a compiled empty batch packs one stand-in token) get zeros.
    """
    out = torch.zeros_like(query, memory_format=torch.contiguous_format)
    for start, count, length in equal_length_runs(cu_seqlens):  # the one read of cu_seqlens from the host
        q, k, v = (run_heads(x, start, count, length) for x in (query, key, value))
        mask = run_mask(start, count, length, term_scale, index, rows, cols, fixed)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[start : start + count * length] = run_tokens(attended)
    return out


@torch.library.custom_op("bertblocks::sdpa_varlen_biased", mutates_args=())
def sdpa_varlen_biased(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    term_scale: float,
    index: torch.Tensor | None,
    rows: torch.Tensor | None,
    cols: torch.Tensor | None,
    fixed: torch.Tensor | None,
) -> torch.Tensor:
    """The compiled graph's varlen attention with a per-sequence score term: :func:`biased_per_sequence`, opaque."""
    return biased_per_sequence(query, key, value, cu_seqlens, scale, term_scale, index, rows, cols, fixed)


@sdpa_varlen_biased.register_fake
def _sdpa_varlen_biased_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    term_scale: float,
    index: torch.Tensor | None,
    rows: torch.Tensor | None,
    cols: torch.Tensor | None,
    fixed: torch.Tensor | None,
) -> torch.Tensor:
    return torch.empty_like(query, memory_format=torch.contiguous_format)


def _grad_like(x: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Zeros shaped as ``x``, or an empty stand-in for an absent term (an op returns tensors only)."""
    if x is None:
        return like.new_empty(0)
    return torch.zeros_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("bertblocks::sdpa_varlen_biased_backward", mutates_args=())
def sdpa_varlen_biased_backward(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    term_scale: float,
    index: torch.Tensor | None,
    rows: torch.Tensor | None,
    cols: torch.Tensor | None,
    fixed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`sdpa_varlen_biased` for query, key, value, rows, cols and fixed (an absent term's: empty).

    Softmax attention's formulas with ``S = scale·QKᵀ + M``, ``P = softmax(S)``, ``O = PV``: ``dV = Pᵀ·dO``,
    ``dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))``, ``dQ = scale·dS·K``, ``dK = scale·dSᵀ·Q``, and ``dM = dS``, which flows
    back into the entries of ``rows``/``cols`` the mask gathered (scatter-add: several pairs read one table row)
    and into ``fixed``'s corner (summed over the run's sequences, which share it).
    """
    gq, gk, gv = (torch.zeros_like(x, memory_format=torch.contiguous_format) for x in (query, key, value))
    g_rows, g_cols, g_fixed = _grad_like(rows, query), _grad_like(cols, query), _grad_like(fixed, query)
    for start, count, length in equal_length_runs(cu_seqlens):
        q, k, v, do = (run_heads(x, start, count, length) for x in (query, key, value, grad))  # [n, h, l, d]
        mask = run_mask(start, count, length, term_scale, index, rows, cols, fixed)
        dq, dk, dv, d_scores = attention_grads(q, k, v, do, scale, mask)  # d_scores [n, h, l, l] is dM too
        run = slice(start, start + count * length)
        gq[run], gk[run], gv[run] = run_tokens(dq), run_tokens(dk), run_tokens(dv)
        if rows is not None or cols is not None:
            h = q.shape[1]
            pairs = _pairs(index, length)
            if rows is not None:
                target = torch.zeros(count, h, length, rows.shape[-1], dtype=rows.dtype, device=rows.device)
                target.scatter_add_(-1, pairs.expand(count, h, length, length), d_scores * term_scale)
                g_rows[run] = run_tokens(target)
            if cols is not None:
                target = torch.zeros(count, h, length, cols.shape[-1], dtype=cols.dtype, device=cols.device)
                target.scatter_add_(
                    -1, pairs.T.expand(count, h, length, length), d_scores.transpose(-1, -2) * term_scale
                )
                g_cols[run] = run_tokens(target)
        if fixed is not None:
            g_fixed[:, :, :length, :length] += d_scores.sum(0, keepdim=True)
    return gq, gk, gv, g_rows, g_cols, g_fixed


@sdpa_varlen_biased_backward.register_fake
def _sdpa_varlen_biased_backward_fake(
    grad: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    term_scale: float,
    index: torch.Tensor | None,
    rows: torch.Tensor | None,
    cols: torch.Tensor | None,
    fixed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    qkv = tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (query, key, value))
    terms = tuple(
        query.new_empty(0) if x is None else torch.empty_like(x, memory_format=torch.contiguous_format)
        for x in (rows, cols, fixed)
    )
    return qkv + terms  # type: ignore[return-value]


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
    query, key, value, cu_seqlens, scale, term_scale, index, rows, cols, fixed = inputs
    ctx.save_for_backward(query, key, value, cu_seqlens, index, rows, cols, fixed)
    ctx.scale, ctx.term_scale = scale, term_scale  # type: ignore[attr-defined]


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    query, key, value, cu_seqlens, index, rows, cols, fixed = ctx.saved_tensors  # type: ignore[attr-defined]
    grads = sdpa_varlen_biased_backward(
        grad.contiguous(),
        query,
        key,
        value,
        cu_seqlens,
        ctx.scale,  # type: ignore[attr-defined]
        ctx.term_scale,  # type: ignore[attr-defined]
        index,
        rows,
        cols,
        fixed,
    )
    gq, gk, gv, g_rows, g_cols, g_fixed = grads
    present = (None if x is None else g for x, g in zip((rows, cols, fixed), (g_rows, g_cols, g_fixed), strict=True))
    return (gq, gk, gv, None, None, None, None, *present)


sdpa_varlen_biased.register_autograd(_backward, setup_context=_setup_context)
