"""Sliding-window ("local") attention: query ``i`` sees only keys ``j`` with ``|i - j| <= window``.

Implemented as an attention backend that adds a band to whatever mask it is given (padding, position
biases) and then runs PyTorch's SDPA or an explicit softmax. It saves no compute (a real kernel would skip
the hidden blocks); it shows how a backend plugin changes *what* is attended.

Shapes::

    query [b, h, q, d]   key/value [b, h, k, d]   mask [b|1, h|1, q|1, k] additive or None
    band hidden [q, k] (bool)   → output [b, h, q, d], weights [b, h, q, k] or None

Queries are the *last* ``q`` of the ``k`` positions (earlier ones may be cached), so query row ``r`` sits at
position ``k - q + r``, as for the causal mask.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from bertblocks.core.interfaces import AttentionBackend, BackendCapabilities
from bertblocks.core.masks import hidden_value, is_hidden


class LocalOptions(BaseModel):
    """Options of the ``local`` attention backend."""

    model_config = ConfigDict(extra="forbid")

    window: NonNegativeInt = Field(128, description="keys at most this many positions before or after a query")
    kernel: Literal["sdpa", "eager"] = Field("sdpa", description="what computes the masked attention")


def band_mask(query_length: int, key_length: int, window: int, causal: bool, device: torch.device) -> torch.Tensor:
    """``[q, k]`` bool, ``True`` where a key is hidden: farther than ``window``, or after the query if ``causal``."""
    q_pos = torch.arange(key_length - query_length, key_length, device=device)[:, None]  # [q, 1]
    k_pos = torch.arange(key_length, device=device)[None, :]  # [1, k]
    hidden = (q_pos - k_pos).abs() > window
    return hidden | (k_pos > q_pos) if causal else hidden


class LocalAttentionBackend(AttentionBackend):
    """The ``local`` backend. See the module docstring."""

    name = "local"
    capabilities = BackendCapabilities(additive_mask=True, attention_weights=True, causal=True, dropout=True)

    def __init__(self, window: int, kernel: Literal["sdpa", "eager"] = "sdpa") -> None:
        self.window = window
        self.kernel = kernel

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
        q, k = query.shape[-2], key.shape[-2]
        # Shapes are Python ints: when the window covers every key the band hides nothing and is skipped, so
        # the result is exactly the plain kernel's.
        if self.window < k - 1 or is_causal:
            hidden = band_mask(q, k, self.window, is_causal, query.device)
            low = hidden_value(query.dtype)
            # Filling (not adding) keeps hidden scores finite, at one value (finfo.min / 2; the mask's hidden keys
            # are set to it too, whatever value hid them): a row hiding every key then gives the uniform softmax,
            # as HF's masks do, on every kernel, instead of NaN or zeros.
            if mask is None:
                mask = torch.zeros(q, k, dtype=query.dtype, device=query.device).masked_fill(hidden, low)
            else:
                mask = torch.where(
                    hidden | is_hidden(mask), torch.tensor(low, dtype=mask.dtype, device=mask.device), mask
                )
        if need_weights or self.kernel == "eager":
            scores = torch.matmul(query, key.transpose(-1, -2)) * scale  # [b, h, q, k]
            if mask is not None:
                scores = scores + mask
            probs = torch.softmax(scores, dim=-1)
            if dropout_p > 0.0:
                probs = F.dropout(probs, p=dropout_p, training=True)
            return torch.matmul(probs, value), (probs if need_weights else None)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        return out, None


def make_local(*, options: LocalOptions) -> LocalAttentionBackend:
    """Factory of the ``local`` backend component."""
    return LocalAttentionBackend(options.window, options.kernel)
