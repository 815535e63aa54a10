"""Attention ``convbert``: ConvBERT's mixed attention (Jiang et al. 2020), softmax heads beside span-based
dynamic convolution heads, as transformers' ``ConvBertSelfAttention`` computes it.

``a = num_heads // head_ratio`` heads (at least one) each of width ``d = hidden_size / a / 2`` attend as BERT's do;
as many convolution heads of the same width mix each position's ``conv_kernel_size`` neighbours with a kernel
computed from that position (a softmax over the window, one per head and position). Both halves are concatenated
(softmax heads first) and go through BERT's output projection, residual and norm. Module names are transformers'
(``attention.self.query``, ``…self.key_conv_attn_layer.depthwise``, ``…self.conv_kernel_layer``,
``…self.conv_out_layer``, ``attention.output.dense``), so ConvBERT checkpoints load unchanged.

Shapes::

    x [b, q, H] → query, key, value [b, q, a·d] → [b, a, q, d] → backend → [b, q, a·d]      (softmax heads)
    x [b, q, H] → separable conv over q → [b, q, a·d] ⊙ query → kernel [b, q, a, k] → softmax over k
    x [b, q, H] → conv_out_layer → [b, q, a·d] → windows [b, q, a, d, k] · kernel → [b, q, a·d]   (convolution heads)
    concat → [b, q, 2·a·d = H] → output dense → dropout → + x → norm

The convolutions read the hidden states of padded positions, as transformers' do (its mask hides padded keys
from the softmax heads only), so the module declares ``reads_padded_positions``: ``packing: auto`` never packs a
model holding it. It returns probabilities for its softmax heads only (``attention_weights: some`` when they are
fewer than ``num_heads``), cannot be pruned, and is an encoder's: the convolutions read later positions, so a
causal decoder, the KV cache and cross-attention are refused when the config is checked. It takes no position
terms (ConvBERT's positions are the embeddings' absolute table): a scheme that adds a score bias or rotates
queries and keys is refused at build time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.core.capabilities import AttentionCapabilities, CapabilityError
from bertblocks.core.component import Component
from bertblocks.core.interfaces import AttentionBackend, Positions, PositionScheme
from bertblocks.core.packing import Packing

from ..errors import InputError
from .projections import AttentionOutput, EncoderOnlyAttention, QKVProjections


class ConvBertAttentionOptions(BaseModel):
    """Options of the ``convbert`` attention (transformers' ConvBertConfig names)."""

    model_config = ConfigDict(extra="forbid")

    head_ratio: PositiveInt = Field(
        2, description="num_heads // head_ratio heads are softmax attention (at least one); as many convolve"
    )
    conv_kernel_size: PositiveInt = Field(
        9, description="odd width of the dynamic convolution's window over positions (and of the key convolution)"
    )

    def model_post_init(self, context: Any) -> None:
        if self.conv_kernel_size % 2 == 0:
            # transformers pads (k - 1) // 2 on each side for the window and k // 2 for the key convolution: with an
            # even k the two come out of different lengths and its model fails
            raise InputError(
                f"conv_kernel_size {self.conv_kernel_size} must be odd (the window is centred on each position)"
            )


class SeparableConv1D(nn.Module):
    """transformers' ``SeparableConv1D``: a depthwise convolution over positions (no bias), a pointwise one to
    ``out_channels`` (no bias), then ``bias`` (stored ``[out_channels, 1]``, as transformers does)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv1d(
            in_channels, in_channels, kernel_size, groups=in_channels, padding=kernel_size // 2, bias=False
        )
        self.pointwise = nn.Conv1d(in_channels, out_channels, kernel_size=1, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels, 1))

    def reset_parameters_like_hf(self, std: float) -> None:
        with torch.no_grad():
            self.depthwise.weight.normal_(0.0, std)
            self.pointwise.weight.normal_(0.0, std)
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x)) + self.bias  # [b, C, q] → [b, out, q]


class MixedProjections(QKVProjections):
    """transformers' ``ConvBertSelfAttention`` parameters (its child name is ``self``): the softmax heads'
    ``query``, ``key``, ``value`` and the convolution heads' modules."""

    def __init__(self, hidden_size: int, width: int, heads: int, kernel_size: int) -> None:
        super().__init__(hidden_size, width)
        self.key_conv_attn_layer = SeparableConv1D(hidden_size, width, kernel_size)
        self.conv_kernel_layer = nn.Linear(width, heads * kernel_size)
        self.conv_out_layer = nn.Linear(hidden_size, width)


class ConvBertAttention(EncoderOnlyAttention):
    """ConvBERT's mixed attention sub-layer (see the module docstring).

    Args:
        hidden_size: ``H``.
        num_heads: the config's heads ``h``; ``a = max(1, h // head_ratio)`` of them attend.
        dropout: attention-probability dropout (softmax heads).
        hidden_dropout: dropout before the residual.
        layer_norm_eps: LayerNorm epsilon.
        backend: the softmax heads' kernel.
        norm: the norm after the residual (post-LN); ``None`` for a layer that normalises itself.
        options: :class:`ConvBertAttentionOptions`.
    """

    kind = "convbert"
    reads_padded_positions = True

    def __init__(
        self,
        *,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        hidden_dropout: float,
        layer_norm_eps: float,
        backend: AttentionBackend,
        norm: nn.Module | str | None,
        options: ConvBertAttentionOptions,
    ) -> None:
        super().__init__()
        heads = max(1, num_heads // options.head_ratio)
        if hidden_size % (2 * heads):
            raise InputError(
                f"encoder.attention: the convbert attention splits hidden_size {hidden_size} into {heads} softmax "
                f"and {heads} convolution heads (num_heads {num_heads} // head_ratio {options.head_ratio}); "
                f"2 · {heads} must divide it"
            )
        self.num_heads = heads  # the softmax heads: the ones that have probabilities
        self.original_num_heads = num_heads
        self.head_dim = hidden_size // heads // 2
        self.kernel_size = options.conv_kernel_size
        self.capabilities = AttentionCapabilities(
            attention_weights="some" if heads < num_heads else "all",
            pruning=False,
            cache=False,
            reason="the convolution heads mix neighbouring positions (padded and later ones included) and share "
            "the softmax heads' queries",
        )
        self.dropout_p = dropout
        self.backend = backend
        width = heads * self.head_dim
        # `self` is transformers' name for this child; kept for checkpoint compatibility
        self.self = MixedProjections(hidden_size, width, heads, self.kernel_size)
        self.output = AttentionOutput(2 * width, hidden_size, layer_norm_eps, hidden_dropout, norm)

    def attend(
        self,
        hidden_states: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        packing: Packing | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if positions.score_bias is not None:
            raise CapabilityError("the convbert attention takes no position score bias (its positions are embedded)")
        if output_attentions and not self.backend.capabilities.attention_weights:
            raise CapabilityError(
                f"output_attentions=True, but attention backend {self.backend.name!r} cannot return attention "
                "weights: set encoder.attention.backend: eager or sdpa, or drop output_attentions"
            )
        if packing is not None:
            # packed only under `packing: always` (the declaration keeps `auto` from packing): the convolutions
            # need the padded layout, so the sequences are laid out padded for this call, and each sequence's
            # windows see zeros past its end, as transformers' convolutions do on that sequence alone
            real = packing.unpack(hidden_states.new_ones(hidden_states.shape[1], 1))  # [b, L, 1]
            padded, weights = self._mix(packing.unpack(hidden_states[0]), mask, head_mask, output_attentions, real)
            return packing.pack(padded)[None], weights
        return self._mix(hidden_states, mask, head_mask, output_attentions)

    def _mix(
        self,
        hidden_states: torch.Tensor,  # [b, q, H]
        mask: torch.Tensor | None,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        real: torch.Tensor | None = None,  # [b, q, 1]: zeros where the packed path laid out padding
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, q, _ = hidden_states.shape
        a, d, k = self.num_heads, self.head_dim, self.kernel_size
        proj = self.self

        query = proj.query(hidden_states)  # [b, q, a·d]
        context, weights = self.backend(
            query.view(b, q, a, d).transpose(1, 2),  # [b, a, q, d]
            proj.key(hidden_states).view(b, q, a, d).transpose(1, 2),
            proj.value(hidden_states).view(b, q, a, d).transpose(1, 2),
            mask=mask,
            scale=d**-0.5,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=False,
            need_weights=output_attentions,
        )
        if head_mask is not None:  # the softmax heads are the first `a` of the layer's heads
            factor = head_mask[:a].view(1, a, 1, 1)
            context = context * factor
            weights = weights * factor if weights is not None else None
        attended = context.transpose(1, 2).reshape(b, q, a * d)  # [b, q, a·d]

        # span-based dynamic convolution: a kernel per position and head, from the key convolution times the query
        key_conv = proj.key_conv_attn_layer(hidden_states.transpose(1, 2)).transpose(1, 2)  # [b, q, a·d]
        kernel = proj.conv_kernel_layer(key_conv * query).view(b, q, a, k).softmax(dim=-1)  # [b, q, a, k]
        spread = proj.conv_out_layer(hidden_states)  # [b, q, a·d]
        if real is not None:  # past a sequence's end its windows hold zeros (not conv_out_layer's bias)
            spread = spread * real
        windows = F.pad(spread, (0, 0, (k - 1) // 2, (k - 1) // 2)).unfold(1, k, 1)  # [b, q, a·d, k]
        convolved = (windows.view(b, q, a, d, k) @ kernel.unsqueeze(-1)).view(b, q, a * d)  # [b, q, a·d]

        out = torch.cat([attended, convolved], dim=-1)  # [b, q, H]
        return self.output(out, hidden_states), weights

    def prune_heads(self, heads: set[int]) -> None:
        raise CapabilityError(self.capabilities.refusal("the convbert attention cannot prune heads"))


def build_convbert_attention(
    *,
    hidden_size: int,
    num_heads: int,
    dropout: float,
    hidden_dropout: float,
    layer_norm_eps: float,
    backend: AttentionBackend,
    position: PositionScheme,
    options: ConvBertAttentionOptions,
    layer_index: int = 0,
    norm: Callable[[], nn.Module] | str | None = "layernorm",
    **_: Any,
) -> ConvBertAttention:
    heads = max(1, num_heads // options.head_ratio)
    terms = position.layer_terms(layer_index, heads, hidden_size // max(1, 2 * heads))
    if terms.bias is not None or terms.rotary is not None or position.adds_score_bias:
        raise InputError(
            f"encoder.attention: the convbert attention takes no position terms (no score bias, no rotation), "
            f"which position scheme {type(position).__name__} adds; use position: absolute (or none)"
        )
    return ConvBertAttention(
        hidden_size=hidden_size,
        num_heads=num_heads,
        dropout=dropout,
        hidden_dropout=hidden_dropout,
        layer_norm_eps=layer_norm_eps,
        backend=backend,
        norm=norm() if callable(norm) else norm,
        options=options,
    )


def encoder_only(config: Any, spec: Any, loc: str) -> list[str]:
    """The config check of the ``convbert`` attention: an encoder's (the convolutions read later positions)."""
    problems = []
    if config.is_decoder:
        problems.append(
            "the convbert attention's convolutions read later positions: it cannot be a causal decoder "
            "(is_decoder: true)"
        )
    if config.add_cross_attention:
        problems.append("the convbert attention has no cross-attention (add_cross_attention: true)")
    return problems


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "attention",
            "convbert",
            build_convbert_attention,
            ConvBertAttentionOptions,
            description="ConvBERT's mixed attention: softmax heads beside span-based dynamic convolution heads",
            validate=encoder_only,
        )
    ]
