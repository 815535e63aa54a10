"""Layer ``post_ln_conv``: BERT's post-LN layer whose first layer also mixes neighbouring tokens with a 1-D
convolution over the layer's *input* (DeBERTa-v2's ``ConvLayer``, ``conv_kernel_size`` > 0).

Layer 0 returns ``norm(out + act(dropout(conv(x)))) · real`` where ``x`` is the layer's input (the embeddings),
``out`` its post-LN output, and the convolution's output is zeroed at padded positions before the activation;
padded positions of the result are zero. Later layers are BERT's. The convolution lives at
``encoder.layer.0.conv.{conv,LayerNorm}``.

Shapes::

    x, out [b, q, H] (packed: [1, T, H], unpacked for the convolution so sequences never mix)
    mask additive [b, 1, 1|q, k] (k == q: an encoder) → real tokens [b, q]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.config import BertConfig, ComponentSpec
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Attention, FeedForward, LayerContext, Positions
from bertblocks.plugins.feedforward import ACTIVATIONS
from bertblocks.plugins.layers import TransformerLayer

from ..errors import InputError

SublayerFactory = Callable[[Callable[[], nn.Module] | None], Any]


class ConvLayerOptions(BaseModel):
    """Options of the ``post_ln_conv`` layer (transformers' DebertaV2Config names in brackets)."""

    model_config = ConfigDict(extra="forbid")

    kernel_size: PositiveInt = Field(3, description="odd width of the convolution (conv_kernel_size)")
    groups: PositiveInt = Field(1, description="convolution groups (conv_groups)")
    activation: str = Field("tanh", description="activation after the convolution (conv_act)")
    dropout: float = Field(0.0, ge=0, le=1, description="dropout on the convolution's output (hidden_dropout_prob)")

    def model_post_init(self, context: Any) -> None:
        if self.kernel_size % 2 == 0:
            raise InputError(f"kernel_size {self.kernel_size} must be odd (the output keeps the sequence length)")
        if self.activation not in ACTIVATIONS:
            raise InputError(f"unknown activation {self.activation!r}; choose one of {', '.join(ACTIVATIONS)}")


class TokenConv(nn.Module):
    """DeBERTa-v2's ``ConvLayer`` (HF's child names ``conv`` and ``LayerNorm``)."""

    def __init__(self, hidden_size: int, options: ConvLayerOptions, norm: nn.Module) -> None:
        super().__init__()
        k = options.kernel_size
        self.conv = nn.Conv1d(hidden_size, hidden_size, k, padding=(k - 1) // 2, groups=options.groups)
        self.LayerNorm = norm
        self.dropout = nn.Dropout(options.dropout)
        self.activation = ACTIVATIONS[options.activation][0]()

    def forward(self, inputs: torch.Tensor, residual: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """``inputs``, ``residual`` ``[b, q, H]``, ``real`` ``[b, q]`` bool → ``[b, q, H]``."""
        # padded inputs read as zeros (transformers' embeddings are zero there), so that the padded and the packed
        # layouts (which has nothing there) give the same numbers
        inputs = inputs * real[..., None].to(inputs.dtype)
        out = self.conv(inputs.transpose(1, 2)).transpose(1, 2)
        out = out.masked_fill(~real[..., None], 0.0)
        out = self.activation(self.dropout(out))
        return self.LayerNorm(residual + out) * real[..., None].to(out.dtype)


class ConvPostLNLayer(TransformerLayer):
    """BERT's post-LN layer followed by :class:`TokenConv` over the layer's input (layer 0 of DeBERTa-v2)."""

    def __init__(
        self, attention: Attention, feedforward: FeedForward, chunk_size_feed_forward: int, conv: TokenConv
    ) -> None:
        super().__init__(attention, feedforward, chunk_size_feed_forward)
        self.conv = conv

    def forward(
        self,
        hidden_states: torch.Tensor,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        context: LayerContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        out, weights, cross = super().forward(hidden_states, mask, positions, head_mask, output_attentions, context)
        packing = context.packing if context is not None else None
        inputs, residual = hidden_states, out
        if packing is not None:  # the convolution must not reach across packed sequences
            inputs, residual = packing.unpack(inputs[0]), packing.unpack(out[0])
        real = _real_tokens(mask, inputs.shape[0], inputs.shape[1], inputs.device)
        mixed = self.conv(inputs, residual, real)
        if packing is not None:
            mixed = packing.pack(mixed)[None]
        return mixed, weights, cross


def _real_tokens(mask: torch.Tensor | None, batch: int, length: int, device: torch.device) -> torch.Tensor:
    """``[b, q]`` True at real tokens, from the additive mask ``[b, 1, 1|q, k]`` of an encoder (``k == q``)."""
    if mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    if mask.shape[-1] != length:
        raise InputError(f"post_ln_conv: the mask covers {mask.shape[-1]} keys for {length} tokens (no KV cache)")
    visible = mask[:, 0] == 0  # [b, 1|q, k]
    # a pairwise mask ([b, q, k], padded queries see nothing) marks a real token on its diagonal
    return visible[:, 0] if visible.shape[1] == 1 else visible.diagonal(dim1=-2, dim2=-1)


def build_post_ln_conv(
    *,
    attention: SublayerFactory,
    crossattention: SublayerFactory | None,
    feedforward: SublayerFactory,
    norm: Callable[[], nn.Module],
    hidden_size: int,
    chunk_size_feed_forward: int,
    layer_index: int,
    options: ConvLayerOptions,
    **_: Any,
) -> TransformerLayer:
    if crossattention is not None:
        raise InputError("post_ln_conv has no cross-attention sub-layer (an encoder layer)")
    if layer_index != 0:
        return TransformerLayer(attention(norm), feedforward(norm), chunk_size_feed_forward)
    return ConvPostLNLayer(
        attention(norm), feedforward(norm), chunk_size_feed_forward, TokenConv(hidden_size, options, norm())
    )


def check_post_ln_conv(config: BertConfig, spec: ComponentSpec, loc: str) -> list[str]:
    if config.is_decoder:
        return ["post_ln_conv mixes each token with the ones after it: an encoder layer (is_decoder: false)"]
    return []


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "layer",
            "post_ln_conv",
            build_post_ln_conv,
            ConvLayerOptions,
            description="post-LN; layer 0 adds a 1-D convolution over its input (DeBERTa-v2's ConvLayer)",
            validate=check_post_ln_conv,
        )
    ]
