"""Pooling: the masked mean every part of bertblocks uses, and the pooler components (BERT's first-token
``tanh(dense(h[:, 0]))``, the first token as it is, and a padding-aware mean).

:func:`masked_mean` is the one masked mean: the ``mean`` pooler, the heads' mean pooling
(:mod:`bertblocks.plugins.heads.pooling`) and sentence embeddings (:mod:`bertblocks.sentence`) all call it.
"""

from __future__ import annotations

import torch
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import Pooler

from ..errors import InputError

#: the smallest token count a mean divides by (sentence-transformers' clamp): an all-padding row gives zeros
MIN_TOKEN_COUNT = 1e-9


def token_mask(attention_mask: torch.Tensor, length: int) -> torch.Tensor:
    """The padding mask ``[b, length]`` of the last ``length`` positions (the queries of this call).

    A 2-D mask ``[b, k]`` covers cached positions too (``k >= length``): its last ``length`` columns are this
    call's tokens. A 3-D mask ``[b, q, k]`` marks a query row real when it attends to anything.
    """
    if attention_mask.dim() == 3:
        attention_mask = attention_mask.amax(dim=-1)  # [b, q]
    if attention_mask.dim() != 2:
        raise InputError(
            "pooling needs an attention_mask [batch, seq] or [batch, seq, seq]; "
            f"got shape {tuple(attention_mask.shape)}"
        )
    return attention_mask[:, -length:]


def masked_mean(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``hidden_states`` ``[b, q, H]`` over the positions ``attention_mask`` ``[b, q]`` keeps → ``[b, H]``.

    Padding (mask 0) does not count. The sum is divided by the number of real tokens clamped to
    :data:`MIN_TOKEN_COUNT` (as sentence-transformers does), so a row that is all padding gives zeros, never
    NaN. Without a mask every position counts.
    """
    if attention_mask is None:
        return hidden_states.mean(dim=1)
    weights = attention_mask[..., None].to(hidden_states.dtype)  # [b, q, 1]
    return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=MIN_TOKEN_COUNT)


class FirstTokenPooler(Pooler):
    """HF's ``BertPooler``: dense + tanh on the first ([CLS]) token."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


class PlainFirstTokenPooler(Pooler):
    """The first token's hidden state as it is, no parameters (MobileBERT's pooler with
    ``classifier_activation: false``, as google/mobilebert-uncased publishes it)."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return hidden_states[:, 0]


class MeanPooler(Pooler):
    """Mean over non-padding positions (sentence-transformers' pooling); no parameters."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = None if attention_mask is None else token_mask(attention_mask, hidden_states.shape[1])
        return masked_mean(hidden_states, mask)


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "pooler",
            "first_token",
            lambda *, hidden_size, options: FirstTokenPooler(hidden_size),
            description="tanh(dense(h[:, 0])) (BERT)",
        ),
        Component(
            "pooler",
            "first_token_plain",
            lambda *, hidden_size, options: PlainFirstTokenPooler(),
            description="h[:, 0] as it is (MobileBERT's classifier_activation: false)",
        ),
        Component("pooler", "mean", lambda *, hidden_size, options: MeanPooler(), description="masked mean"),
    ]
