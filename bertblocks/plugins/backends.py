"""Attention kernels: ``eager`` (explicit softmax, HF's reference maths) and ``sdpa`` (PyTorch's fused
``scaled_dot_product_attention``, the default)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertblocks.core.component import Component
from bertblocks.core.interfaces import AttentionBackend, BackendCapabilities
from bertblocks.core.masks import causal_additive


class EagerBackend(AttentionBackend):
    """``softmax(QKᵀ·scale + mask) @ V`` written out, returning the probabilities when asked."""

    name = "eager"
    capabilities = BackendCapabilities(additive_mask=True, attention_weights=True, causal=True, dropout=True)

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        scale: float,
        dropout_p: float,
        is_causal: bool,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        scores = torch.matmul(query, key.transpose(-1, -2)) * scale  # [b, h, q, k]
        if is_causal:
            scores = scores + causal_additive(*scores.shape[-2:], scores.dtype, scores.device)
        if mask is not None:
            scores = scores + mask
        probs = torch.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            probs = F.dropout(probs, p=dropout_p, training=True)
        return torch.matmul(probs, value), (probs if need_weights else None)


class SdpaBackend(AttentionBackend):
    """PyTorch's fused attention. When probabilities are asked for, it computes them explicitly (the fused
    kernels never form them), so ``output_attentions=True`` works on every built-in backend."""

    name = "sdpa"
    capabilities = BackendCapabilities(additive_mask=True, attention_weights=True, causal=True, dropout=True)

    def __init__(self) -> None:
        self._explicit = EagerBackend()

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        scale: float,
        dropout_p: float,
        is_causal: bool,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if need_weights:
            return self._explicit(
                query,
                key,
                value,
                mask=mask,
                scale=scale,
                dropout_p=dropout_p,
                is_causal=is_causal,
                need_weights=True,
            )
        q, k = query.shape[-2], key.shape[-2]
        if is_causal and (mask is not None or q != k):
            # SDPA's own is_causal aligns top-left and cannot be combined with a mask; with a cache (q < k) or
            # a padding mask the causal part is added explicitly, aligned bottom-right.
            causal = causal_additive(q, k, query.dtype, query.device)
            mask, is_causal = (causal if mask is None else mask + causal), False
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        return out, None


def bertblocks_register_components() -> list[Component]:
    return [
        Component("backend", "eager", lambda *, options: EagerBackend(), description="explicit softmax (reference)"),
        Component(
            "backend",
            "sdpa",
            lambda *, options: SdpaBackend(),
            description="torch scaled_dot_product_attention",
        ),
    ]
