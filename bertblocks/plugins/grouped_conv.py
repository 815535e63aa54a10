"""Attention and feed-forward ``grouped_conv``: BERT's sub-layers with every projection a *grouped pointwise
convolution* (SqueezeBERT, Iandola et al. 2020): a kernel-1 ``nn.Conv1d`` over the channels with ``groups``, so that
slice ``g`` of the input feeds slice ``g`` of the output alone.

The projections are :class:`~bertblocks.plugins.grouped_linear.GroupedLinear` modules in the ``"conv1d"`` layout
(weight ``[out, in/groups, 1]``, as transformers' SqueezeBERT stores its ``nn.Conv1d``), applied to
``[..., channels]`` states position by position, so the rest of BERT's attention (backends, masks, packing,
cross-attention, the cache) and feed-forward is unchanged. A grouped projection cannot lose one head's rows without
changing the others' groups: the attention declares that it cannot be pruned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.core.capabilities import AttentionCapabilities
from bertblocks.core.component import Component
from bertblocks.core.interfaces import AttentionBackend, FeedForward, PositionScheme

from .attention import AttentionOptions, BertAttention, build_bert_attention
from .feedforward import build_bert_feedforward
from .grouped_linear import GroupedLinear


class GroupedConvAttentionOptions(BaseModel):
    """Options of the ``grouped_conv`` attention (transformers' SqueezeBertConfig names in brackets)."""

    model_config = ConfigDict(extra="forbid")

    q_groups: PositiveInt = Field(4, description="groups of the query projection (q_groups)")
    k_groups: PositiveInt = Field(4, description="groups of the key projection (k_groups)")
    v_groups: PositiveInt = Field(4, description="groups of the value projection (v_groups)")
    output_groups: PositiveInt = Field(1, description="groups of the output projection (post_attention_groups)")


class GroupedConvFeedForwardOptions(BaseModel):
    """Options of the ``grouped_conv`` feed-forward (transformers' SqueezeBertConfig names in brackets)."""

    model_config = ConfigDict(extra="forbid")

    intermediate_groups: PositiveInt = Field(4, description="groups of the first projection (intermediate_groups)")
    output_groups: PositiveInt = Field(4, description="groups of the second projection (output_groups)")


def build_grouped_conv_attention(
    *,
    hidden_size: int,
    num_heads: int,
    dropout: float,
    hidden_dropout: float,
    layer_norm_eps: float,
    backend: AttentionBackend,
    position: PositionScheme,
    options: GroupedConvAttentionOptions,
    layer_index: int = 0,
    norm: Callable[[], nn.Module] | str | None = "layernorm",
    **_: Any,
) -> BertAttention:
    attention = build_bert_attention(
        hidden_size=hidden_size,
        num_heads=num_heads,
        dropout=dropout,
        hidden_dropout=hidden_dropout,
        layer_norm_eps=layer_norm_eps,
        backend=backend,
        position=position,
        options=AttentionOptions(),
        layer_index=layer_index,
        norm=norm,
    )
    # BERT's attention with its projections replaced, under the same names (query, key, value, output.dense)
    proj = attention.self
    proj.query = _pointwise(hidden_size, hidden_size, options.q_groups)
    proj.key = _pointwise(hidden_size, hidden_size, options.k_groups)
    proj.value = _pointwise(hidden_size, hidden_size, options.v_groups)
    attention.output.dense = _pointwise(hidden_size, hidden_size, options.output_groups)
    attention.capabilities = AttentionCapabilities(
        pruning=False, reason="a grouped projection cannot lose one head's rows without regrouping the others"
    )
    return attention


def build_grouped_conv_feedforward(
    *,
    hidden_size: int,
    intermediate_size: int,
    activation: Callable[[], nn.Module],
    dropout: float,
    layer_norm_eps: float,
    options: GroupedConvFeedForwardOptions,
    norm: Callable[[], nn.Module] | str | None = "layernorm",
) -> FeedForward:
    block = build_bert_feedforward(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        activation=activation,
        dropout=dropout,
        layer_norm_eps=layer_norm_eps,
        options=None,
        norm=norm,
    )
    # BERT's block with its projections replaced, under the same names (intermediate.dense, output.dense)
    block.intermediate.dense = _pointwise(hidden_size, intermediate_size, options.intermediate_groups)
    block.output.dense = _pointwise(intermediate_size, hidden_size, options.output_groups)
    return block


def _pointwise(in_channels: int, out_channels: int, groups: int) -> GroupedLinear:
    """A kernel-1 grouped convolution over the channels (transformers' SqueezeBERT ``nn.Conv1d(cin, cout,
    kernel_size=1, groups=groups)`` on ``[b, C, q]``), stored as that convolution's weight."""
    return GroupedLinear(in_channels, out_channels, groups, bias=True, layout="conv1d")


def _divides(pairs: list[tuple[str, int, str, int]]) -> list[str]:
    return [
        f"{name} {groups} must divide {what} {width} (each group projects a slice of it)"
        for name, groups, what, width in pairs
        if width % groups
    ]


def attention_groups_fit(config: Any, spec: Any, loc: str) -> list[str]:
    """The config check of the ``grouped_conv`` attention: each projection's groups divide the hidden size."""
    options = spec.options()
    names = ("q_groups", "k_groups", "v_groups", "output_groups")
    return _divides([(name, options.get(name, 1), "hidden_size", config.hidden_size) for name in names])


def feedforward_groups_fit(config: Any, spec: Any, loc: str) -> list[str]:
    """The config check of the ``grouped_conv`` feed-forward: each projection's groups divide both its widths."""
    options = spec.options()
    first, second = options.get("intermediate_groups", 1), options.get("output_groups", 1)
    return _divides(
        [
            ("intermediate_groups", first, "hidden_size", config.hidden_size),
            ("intermediate_groups", first, "intermediate_size", spec.intermediate_size),
            ("output_groups", second, "intermediate_size", spec.intermediate_size),
            ("output_groups", second, "hidden_size", config.hidden_size),
        ]
    )


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "attention",
            "grouped_conv",
            build_grouped_conv_attention,
            GroupedConvAttentionOptions,
            description="BERT's attention with grouped pointwise-convolution projections (SqueezeBERT)",
            validate=attention_groups_fit,
        ),
        Component(
            "feedforward",
            "grouped_conv",
            build_grouped_conv_feedforward,
            GroupedConvFeedForwardOptions,
            description="BERT's feed-forward with grouped pointwise-convolution projections (SqueezeBERT)",
            validate=feedforward_groups_fit,
        ),
    ]
