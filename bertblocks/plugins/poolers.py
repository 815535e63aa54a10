"""Poolers: BERT's first-token ``tanh(dense(h[:, 0]))`` and a padding-aware mean."""

from __future__ import annotations

import torch
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import Pooler


class FirstTokenPooler(Pooler):
    """HF's ``BertPooler``: dense + tanh on the first ([CLS]) token."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


class MeanPooler(Pooler):
    """Mean over non-padding positions (sentence-transformers' pooling); no parameters."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is None:
            return hidden_states.mean(dim=1)
        if attention_mask.dim() == 3:  # [b, q, k]: a query row is real when it attends to anything
            attention_mask = attention_mask.amax(dim=-1)
        weights = attention_mask[:, -hidden_states.shape[1] :, None].to(hidden_states.dtype)  # [b, q, 1]
        return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "pooler",
            "first_token",
            lambda *, hidden_size, options: FirstTokenPooler(hidden_size),
            description="tanh(dense(h[:, 0])) (BERT)",
        ),
        Component("pooler", "mean", lambda *, hidden_size, options: MeanPooler(), description="masked mean"),
    ]
