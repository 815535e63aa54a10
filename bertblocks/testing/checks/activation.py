"""Activations: element-wise functions that follow the input's dtype."""

from __future__ import annotations

import torch
from torch import nn

from ..assertions import close, expect
from ..subject import Subject


def check_activation(subject: Subject) -> None:
    """Element-wise: shape kept, permutation-equivariant, float64 in gives float64 out (matching float32)."""
    act = subject.make()
    expect(isinstance(act, nn.Module), f"factory returned {type(act).__name__}, not an nn.Module")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 6, generator=g) * 3
    perm = torch.randperm(x.numel(), generator=g)
    y = act(x)
    expect(y.shape == x.shape, f"activation changed the shape {tuple(x.shape)} → {tuple(y.shape)}")
    close("permuted elements", act(x.flatten()[perm]), y.flatten()[perm])
    y64 = act(x.double())
    expect(y64.dtype == torch.float64, f"float64 input gave {y64.dtype}")
    close("float64 vs float32", y64, y, atol=1e-5)
