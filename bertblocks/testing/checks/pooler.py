"""Poolers: ``[b, q, H]`` to ``[b, H]``, blind to padded positions."""

from __future__ import annotations

import torch

from ..assertions import close, expect
from ..inputs import padded_batch
from ..subject import ConformanceSkip, Subject


def check_pooler(subject: Subject) -> None:
    """``[b, q, H]`` (with a padding mask) → ``[b, H]``; states at padded positions do not change the result."""
    pooler = subject.model().pooler
    if pooler is None:
        raise ConformanceSkip("the model has no pooler")
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 9, 32, generator=g)
    mask = padded_batch()["attention_mask"]
    changed = hidden.clone()
    changed[mask == 0] = torch.randn(int((mask == 0).sum()), 32, generator=g)
    with torch.no_grad():
        pooled = pooler(hidden, mask)
        expect(tuple(pooled.shape) == (3, 32), f"pooled output is {tuple(pooled.shape)}, not (3, 32)")
        close("pooled output after changing padded states", pooler(changed, mask), pooled)
