"""Norms: ``layernorm`` (with or without bias), ``rmsnorm`` and ``no_norm`` (an elementwise ``weight · x + bias``
without statistics: MobileBERT's ``NoNorm``).

A norm factory returns a fresh module per place it is used (``attention.output.LayerNorm``, a pre-LN layer's
``attention_norm``, ``encoder.final_norm``); the epsilon is the config's ``layer_norm_eps``.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from bertblocks.core.component import Component


class LayerNormOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bias: bool = Field(True, description="learn a bias (false: scale only, as ModernBERT's norm_bias: false)")


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): ``weight · x / sqrt(mean(x²) + eps)``, no centring, no bias.

    Computed in float32 and cast back, as transformers' Llama/Gemma-style ``RMSNorm`` does (``weight`` applied
    after the cast, as in Llama), so half-precision inputs do not lose the mean of squares.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        x = hidden_states.float() if dtype in (torch.float16, torch.bfloat16) else hidden_states
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    @torch.no_grad()
    def reset_parameters_like_hf(self, std: float) -> None:
        self.weight.fill_(1.0)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class NoNorm(nn.Module):
    """MobileBERT's ``NoNorm``: ``weight · x + bias`` per feature, no mean or variance (cheap on phones; the
    epsilon is unused). Parameters ``weight`` (ones) and ``bias`` (zeros), transformers' names."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * self.weight + self.bias

    @torch.no_grad()
    def reset_parameters_like_hf(self, std: float) -> None:
        self.weight.fill_(1.0)
        self.bias.zero_()

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}"


def build_layernorm(*, hidden_size: int, eps: float, options: LayerNormOptions) -> nn.LayerNorm:
    return nn.LayerNorm(hidden_size, eps=eps, bias=options.bias)


def build_rmsnorm(*, hidden_size: int, eps: float, options: object) -> RMSNorm:
    return RMSNorm(hidden_size, eps)


def build_no_norm(*, hidden_size: int, eps: float, options: object) -> NoNorm:
    return NoNorm(hidden_size)


def bertblocks_register_components() -> list[Component]:
    return [
        Component("norm", "layernorm", build_layernorm, LayerNormOptions, description="LayerNorm (bias optional)"),
        Component("norm", "rmsnorm", build_rmsnorm, description="RMSNorm: scale by the root mean square, no bias"),
        Component("norm", "no_norm", build_no_norm, description="weight · x + bias per feature, no statistics"),
    ]
