"""Feed-forward blocks: BERT's ``LayerNorm(dropout(dense2(act(dense1(x)))) + x)``, the gated ``glu``
(``dense2(act(gate(x)) · up(x))``: geglu, swiglu, reglu, …), and activations by name.

Built for a pre-LN or parallel layer (the factory's ``norm`` is ``None``), the output module returns
``dropout(dense2(...))`` alone: the layer adds the residual and owns the norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import FeedForward, FeedForwardOutput, Intermediate

from .grouped_linear import GroupedLinear


class BertFeedForwardOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bias: bool = Field(True, description="biases on both projections")
    output_dropout: bool = Field(
        True,
        description="the hidden dropout after the output projection (BERT's place); false: none there, as "
        "XLM-RoBERTa-XL's feed-forward output. The same numbers without dropout",
    )
    groups: PositiveInt = Field(
        1,
        description="grouped projections: slice g of the input feeds slice g of the output alone, one [in/groups, "
        "out/groups] weight per group (ConvBERT's num_groups); 1: dense",
    )


class GLUOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bias: bool = Field(True, description="biases on the projections (ModernBERT's mlp_bias)")
    output_bias: bool | None = Field(
        None,
        description="bias on the output projection (output.dense) alone; null: as bias. Jina-embeddings-v2 has "
        "none on its gated input projection and one on its output",
    )
    fused: bool = Field(
        False,
        description="one input projection intermediate.dense of 2·intermediate_size outputs, the activated half "
        "first (ModernBERT's Wi); false: two, intermediate.gate (activated) and intermediate.up",
    )
    input_bias: bool | None = Field(
        None,
        description="biases on the input projections (gate and up) alone; null: as bias. GTE has none there and "
        "one on its output projection",
    )
    dropout_at: Literal["output", "gated", "both"] = Field(
        "output",
        description="where the hidden dropout applies: output, after the output projection (BERT's place); gated, "
        "on the gated product act(gate(x))·up(x) before it (JinaBERT's, MosaicBERT's); both (GTE's). The same "
        "numbers without dropout",
    )


class BertIntermediate(Intermediate):
    """HF's ``BertIntermediate``: ``act(dense(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: nn.Module, bias: bool = True) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.intermediate_act_fn = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class GLUIntermediate(Intermediate):
    """The gated first half: ``act(gate(x)) · up(x)`` (Shazeer 2020), ``[b, q, H] → [b, q, I]``.

    Fused, one ``dense`` projection makes ``[b, q, 2I]`` whose first half is activated (ModernBERT's ``Wi``
    layout); split, ``gate`` and ``up`` are two ``[I, H]`` projections (Llama's ``gate_proj``/``up_proj``).
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        activation: nn.Module,
        bias: bool,
        fused: bool,
        dropout: float | None = None,
    ) -> None:
        super().__init__()
        self.fused = fused
        # dropout on the gated product (JinaBERT, GTE); none by default, so other models' module trees are unchanged
        self.dropout = nn.Dropout(dropout) if dropout is not None else None
        if fused:
            self.dense = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        else:
            self.gate = nn.Linear(hidden_size, intermediate_size, bias=bias)
            self.up = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.intermediate_act_fn = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.dense(hidden_states).chunk(2, dim=-1)  # [b, q, I] each
        else:
            gate, up = self.gate(hidden_states), self.up(hidden_states)
        gated = self.intermediate_act_fn(gate) * up
        return gated if self.dropout is None else self.dropout(gated)


class ResidualOutput(nn.Module):
    """The projection that ends a BERT sub-layer: ``LayerNorm(dropout(dense(h)) + residual)`` (HF's
    ``BertSelfOutput`` after attention, ``BertOutput`` after the feed-forward block); without a norm
    (``norm=None``: a pre-LN or parallel layer adds the residual and owns the norm) ``dropout(dense(h))``, and
    ``residual`` is ignored."""

    def __init__(
        self,
        in_features: int,
        hidden_size: int,
        layer_norm_eps: float,
        dropout: float,
        norm: nn.Module | str | None = "layernorm",
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, hidden_size, bias=bias)
        if norm == "layernorm":  # the default of direct callers (before norms were a component)
            norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.post_norm = norm is not None
        if isinstance(norm, nn.Module):
            self.LayerNorm = norm  # CamelCase: HF's checkpoint key, whatever the norm kind
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out = self.dropout(self.dense(hidden_states))
        return self.LayerNorm(out + residual) if self.post_norm else out


class BertOutput(ResidualOutput, FeedForwardOutput):
    """HF's ``BertOutput``: the :class:`ResidualOutput` of the feed-forward block, ``intermediate_size`` wide in."""

    def forward(self, intermediate: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # the interface's argument name (FeedForwardOutput), which `bertblocks trace` shows
        return super().forward(intermediate, residual)


def build_bert_feedforward(
    *,
    hidden_size: int,
    intermediate_size: int,
    activation: Callable[[], nn.Module],
    dropout: float,
    layer_norm_eps: float,
    options: BertFeedForwardOptions | object,
    norm: Callable[[], nn.Module] | str | None = "layernorm",
) -> FeedForward:
    bias = getattr(options, "bias", True)
    if not getattr(options, "output_dropout", True):
        dropout = 0.0
    groups = getattr(options, "groups", 1)
    intermediate = BertIntermediate(hidden_size, intermediate_size, activation(), bias)
    output = BertOutput(
        intermediate_size, hidden_size, layer_norm_eps, dropout, _norm(norm, hidden_size, layer_norm_eps), bias
    )
    if groups > 1:  # the same modules with grouped projections in place of the dense ones (same key names)
        where = "encoder.feedforward.groups"
        intermediate.dense = GroupedLinear(hidden_size, intermediate_size, groups, bias, "blocks", where)
        output.dense = GroupedLinear(intermediate_size, hidden_size, groups, bias, "blocks", where)
    return FeedForward(intermediate=intermediate, output=output)


def build_glu_feedforward(
    *,
    hidden_size: int,
    intermediate_size: int,
    activation: Callable[[], nn.Module],
    dropout: float,
    layer_norm_eps: float,
    options: GLUOptions,
    norm: Callable[[], nn.Module] | str | None = "layernorm",
) -> FeedForward:
    return FeedForward(
        intermediate=GLUIntermediate(
            hidden_size,
            intermediate_size,
            activation(),
            options.bias if options.input_bias is None else options.input_bias,
            options.fused,
            dropout if options.dropout_at in ("gated", "both") else None,
        ),
        output=BertOutput(
            intermediate_size,
            hidden_size,
            layer_norm_eps,
            0.0 if options.dropout_at == "gated" else dropout,
            _norm(norm, hidden_size, layer_norm_eps),
            options.bias if options.output_bias is None else options.output_bias,
        ),
    )


def _norm(norm: Callable[[], nn.Module] | str | None, hidden_size: int, eps: float) -> nn.Module | str | None:
    """The builder passes a no-argument factory of the configured norm (or ``None``); a direct caller that
    passes nothing gets BERT's LayerNorm (``"layernorm"``, made by the output module)."""
    return norm() if callable(norm) else norm


#: gated activation names (Shazeer 2020) → the activation of their gate: aliases of that activation, so that a
#: ``glu`` feed-forward is configured the way papers name it (``activation: swiglu``). The gating is the glu
#: block's; on the ungated ``bert`` block ``swiglu`` is SiLU.
GATED_ACTIVATIONS: dict[str, str] = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu"}


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


def grouped_widths(config: Any, spec: Any, loc: str) -> list[str]:
    """The config check of the ``bert`` feed-forward: ``groups`` divides both widths of each projection."""
    groups = spec.options().get("groups", 1)
    return [
        f"groups {groups} must divide {what} {width} (each group projects a slice of it)"
        for what, width in (("hidden_size", config.hidden_size), ("intermediate_size", spec.intermediate_size))
        if width % groups
    ]


def _activation_factory(make: Callable[[], nn.Module]) -> Callable[..., nn.Module]:
    def factory(*, options: object) -> nn.Module:
        return make()

    return factory


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "feedforward",
            "bert",
            build_bert_feedforward,
            BertFeedForwardOptions,
            description="dense → act → dense (bias optional; grouped projections optional)",
            validate=grouped_widths,
        ),
        Component(
            "feedforward",
            "glu",
            build_glu_feedforward,
            GLUOptions,
            description="gated: dense(act(gate(x)) · up(x)); geglu, swiglu, reglu; split or fused input",
        ),
        *(
            Component(
                "activation",
                name,
                _activation_factory(make),
                description=text + "".join(f"; also {g} (its gate)" for g, a in GATED_ACTIVATIONS.items() if a == name),
                aliases=tuple(g for g, a in GATED_ACTIVATIONS.items() if a == name),
            )
            for name, (make, text) in ACTIVATIONS.items()
        ),
    ]
