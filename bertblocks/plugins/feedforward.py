"""BERT's feed-forward block, ``LayerNorm(dropout(dense2(act(dense1(x)))) + x)``, and activations by name."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import FeedForward, FeedForwardOutput, Intermediate


class BertIntermediate(Intermediate):
    """HF's ``BertIntermediate``: ``act(dense(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: nn.Module) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, intermediate_size)
        self.intermediate_act_fn = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class BertOutput(FeedForwardOutput):
    """HF's ``BertOutput``: ``LayerNorm(dropout(dense(h)) + residual)``."""

    def __init__(self, intermediate_size: int, hidden_size: int, layer_norm_eps: float, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(intermediate_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, intermediate: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(intermediate)) + residual)


def build_bert_feedforward(
    *,
    hidden_size: int,
    intermediate_size: int,
    activation: Callable[[], nn.Module],
    dropout: float,
    layer_norm_eps: float,
    options: object,
) -> FeedForward:
    return FeedForward(
        intermediate=BertIntermediate(hidden_size, intermediate_size, activation()),
        output=BertOutput(intermediate_size, hidden_size, layer_norm_eps, dropout),
    )


# ------------------------------------------------------------------------------------------- activations
class NewGELU(nn.Module):
    """Google BERT's tanh approximation of GELU, written as HF's ``gelu_new`` (bit-for-bit the same maths)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class FastGELU(nn.Module):
    """HF's ``gelu_fast``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


class QuickGELU(nn.Module):
    """HF's ``quick_gelu``: ``x * sigmoid(1.702 x)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class LinearActivation(nn.Module):
    """Identity (HF's ``linear``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class GELUTanh(nn.Module):
    """PyTorch's tanh-approximated GELU (HF's ``gelu_pytorch_tanh``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


#: HF ``hidden_act`` names → module factories. ``gelu`` is the exact erf form, as in HF.
ACTIVATIONS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "gelu": (nn.GELU, "exact GELU, x·Φ(x) (erf form)"),
    "gelu_new": (NewGELU, "tanh approximation of GELU (Google BERT's)"),
    "gelu_pytorch_tanh": (GELUTanh, "PyTorch's tanh-approximated GELU"),
    "gelu_fast": (FastGELU, "faster tanh approximation of GELU"),
    "quick_gelu": (QuickGELU, "x·sigmoid(1.702x)"),
    "relu": (nn.ReLU, "max(0, x)"),
    "silu": (nn.SiLU, "x·sigmoid(x)"),
    "swish": (nn.SiLU, "x·sigmoid(x) (alias of silu)"),
    "mish": (nn.Mish, "x·tanh(softplus(x))"),
    "tanh": (nn.Tanh, "tanh(x)"),
    "sigmoid": (nn.Sigmoid, "sigmoid(x)"),
    "linear": (LinearActivation, "identity"),
}


def _activation_factory(make: Callable[[], nn.Module]) -> Callable[..., nn.Module]:
    def factory(*, options: object) -> nn.Module:
        return make()

    return factory


def bertblocks_register_components() -> list[Component]:
    return [
        Component("feedforward", "bert", build_bert_feedforward, description="dense → act → dense → LN(+x)"),
        *(
            Component("activation", name, _activation_factory(make), description=text)
            for name, (make, text) in ACTIVATIONS.items()
        ),
    ]
