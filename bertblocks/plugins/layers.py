"""Layer kinds: how attention, (cross-attention,) feed-forward, norms and residuals compose.

- ``post_ln`` (BERT): ``x = norm(x + attn(x))``, ``x = norm(x + ff(x))``; the norms sit inside the sub-layers
  at HF's keys (``attention.output.LayerNorm``, ``output.LayerNorm``). Bit for bit what BERT computes.
- ``pre_ln``: ``x = x + attn(norm(x))``, ``x = x + ff(norm(x))``, with a final norm after the stack
  (``encoder.final_norm``); ``first_attention_norm: false`` leaves layer 0's attention input unnormalised, as
  ModernBERT does (its embeddings already end with a norm). A feed-forward output that ``closes_residual`` (X-MOD's
  adapters) gets ``x`` and the norm and returns the whole sub-layer: ``x = ff(norm(x), x, norm)``.
- ``parallel`` (GPT-J, PaLM): ``x = x + attn(norm(x)) + ff(norm(x))``, one norm shared by both branches (or one
  each, ``shared_norm: false``, as GPT-NeoX).

Keys of a pre-LN layer: ``attention_norm``, ``attention.*``, ``crossattention_norm``, ``crossattention.*``,
``feedforward_norm``, ``intermediate.*``, ``output.*``; of a parallel one ``norm`` (or ``attention_norm`` and
``feedforward_norm``), ``attention.*``, ``intermediate.*``, ``output.*``.

A plugin's layer kind reuses the sub-layer calls every kind here makes: :func:`self_attend` and
:func:`cross_attend` (the attention call with what the pass's :class:`~bertblocks.core.interfaces.LayerContext`
says) and :func:`run_feedforward` (chunked as ``chunk_size_feed_forward`` asks); or subclasses
:class:`TransformerLayer` (``post_ln_conv`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from bertblocks.config import BertConfig, ComponentSpec, ConfigIssue
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Attention, FeedForward, Layer, LayerContext, Positions

from ..errors import InputError

#: what a layer factory receives to make its sub-layers: ``attention(norm)`` with ``norm`` a no-argument
#: factory of the norm that ends the sub-layer (post-LN) or ``None`` (the layer normalises)
SublayerFactory = Callable[[Callable[[], nn.Module] | None], Any]


#: the context of a plain encoder pass (no cache, not causal, no cross-attention, layer 0), for a layer called
#: without one
_PLAIN_PASS = LayerContext()


# --------------------------------------------------------------------------- post-LN (BERT) and the sub-layer calls
class TransformerLayer(Layer):
    """One post-LN layer (BERT's, the default layer kind): attention sub-layer, (decoders: cross-attention
    sub-layer,) then feed-forward sub-layer, each ending with its residual and norm (which the sub-layers
    hold, at HF's keys ``attention.output.LayerNorm`` and ``output.LayerNorm``)."""

    def __init__(
        self,
        attention: Attention,
        feedforward: FeedForward,
        chunk_size_feed_forward: int = 0,
        crossattention: Attention | None = None,
    ) -> None:
        super().__init__()
        self.attention = attention
        if crossattention is not None:
            self.crossattention = crossattention  # HF's key: `layer.N.crossattention.*`
        self.has_cross_attention = crossattention is not None
        # Registered as direct children, as HF does: keys `layer.N.intermediate.*` and `layer.N.output.*`.
        self.intermediate = feedforward.intermediate
        self.output = feedforward.output
        self.chunk_size_feed_forward = chunk_size_feed_forward

    def forward(
        self,
        hidden_states: torch.Tensor,  # [b, q, H]
        mask: torch.Tensor | None,  # additive [b, 1, 1|q, k]
        positions: Positions,
        head_mask: torch.Tensor | None = None,  # [h_original]
        output_attentions: bool = False,
        context: LayerContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Returns the layer output, the self-attention and the cross-attention probabilities (or None)."""
        ctx = context or _PLAIN_PASS
        attended, weights = self_attend(
            self.attention, hidden_states, mask, positions, head_mask, output_attentions, ctx
        )
        cross_weights = None
        if self.has_cross_attention:
            attended, cross_weights = cross_attend(
                self.crossattention, attended, positions, head_mask, output_attentions, ctx
            )
        return run_feedforward(self, attended, ctx), weights, cross_weights


def self_attend(
    attention: Attention,
    hidden_states: torch.Tensor,
    mask: torch.Tensor | None,
    positions: Positions,
    head_mask: torch.Tensor | None,
    output_attentions: bool,
    ctx: LayerContext,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layer's self-attention call with what the forward pass's context says (cache, causality, packing, the
    extra inputs the attention declares it reads): written once for every layer kind."""
    extra = {name: ctx.inputs.get(name) for name in attention.extra_inputs}
    return attention(
        hidden_states,
        mask=mask,
        positions=positions,
        head_mask=head_mask,
        output_attentions=output_attentions,
        cache=ctx.cache,
        layer_index=ctx.layer_index,
        is_causal=ctx.is_causal,
        packing=ctx.packing,
        **extra,
    )


def cross_attend(
    crossattention: Attention,
    hidden_states: torch.Tensor,
    positions: Positions,
    head_mask: torch.Tensor | None,
    output_attentions: bool,
    ctx: LayerContext,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A decoder layer's cross-attention call on the encoder's states from the context."""
    if ctx.encoder_hidden_states is None:
        raise InputError("this decoder has cross-attention layers: pass encoder_hidden_states")
    return crossattention(
        hidden_states,
        mask=ctx.encoder_mask,
        positions=positions,
        head_mask=head_mask,
        output_attentions=output_attentions,
        encoder_hidden_states=ctx.encoder_hidden_states,
        cache=ctx.cache,
        layer_index=ctx.layer_index,
    )


def run_feedforward(
    layer: nn.Module,
    hidden_states: torch.Tensor,
    ctx: LayerContext | None = None,
    residual: torch.Tensor | None = None,
    **fixed: Any,
) -> torch.Tensor:
    """``layer.output(layer.intermediate(x), x)`` (the sub-layer's own residual and norm, if it has them), over
    chunks of ``layer.chunk_size_feed_forward`` positions when set: HF's apply_chunking_to_forward (the block is
    position-wise, so splitting along the sequence is exact and bounds the [b, chunk, intermediate]
    activation). An output that declares ``extra_inputs`` gets them from ``ctx.token_inputs``, chunked alike.
    ``residual`` (default ``x``) is what the output adds, chunked alike; ``fixed`` are further keywords of the
    output (a pre-LN layer hands an output that ``closes_residual`` its ``norm``)."""
    names = getattr(layer.output, "extra_inputs", ())
    extra = {name: (ctx or _PLAIN_PASS).token_inputs[name] for name in names}  # [b, q] or packed [1, T]
    residual = hidden_states if residual is None else residual
    chunk = layer.chunk_size_feed_forward
    if chunk and hidden_states.shape[1] > chunk:
        parts = [
            layer.output(
                layer.intermediate(p),
                r,
                **fixed,
                **{name: value[:, start : start + chunk] for name, value in extra.items()},
            )
            for start, p, r in zip(
                range(0, hidden_states.shape[1], chunk),
                hidden_states.split(chunk, dim=1),
                residual.split(chunk, dim=1),
                strict=True,
            )
        ]
        return torch.cat(parts, dim=1)
    return layer.output(layer.intermediate(hidden_states), residual, **fixed, **extra)


class PreLNOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    first_attention_norm: bool = Field(
        True,
        description="norm the input of layer 0's attention; false as ModernBERT (its embeddings end with a norm)",
    )


class ParallelOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shared_norm: bool = Field(True, description="one norm feeds both branches (GPT-J); false: one each (GPT-NeoX)")


class _ResidualLayer(Layer):
    """What the layers that own their norms hold: attention and the feed-forward halves at HF's keys."""

    final_norm_default: ClassVar[bool] = True

    def __init__(self, attention: Attention, feedforward: FeedForward, chunk_size_feed_forward: int) -> None:
        super().__init__()
        self.attention = attention
        # HF's names for the feed-forward halves, as in the post-LN layer
        self.intermediate = feedforward.intermediate
        self.output = feedforward.output
        self.chunk_size_feed_forward = chunk_size_feed_forward


class PreLNLayer(_ResidualLayer):
    """``x + attn(norm(x))``, (``+ crossattn(norm(x), encoder)``,) then ``x + ff(norm(x))``."""

    def __init__(
        self,
        attention: Attention,
        feedforward: FeedForward,
        attention_norm: nn.Module | None,
        feedforward_norm: nn.Module,
        chunk_size_feed_forward: int = 0,
        crossattention: Attention | None = None,
        crossattention_norm: nn.Module | None = None,
    ) -> None:
        super().__init__(attention, feedforward, chunk_size_feed_forward)
        # nn.Identity holds no parameters: layer 0 of ModernBERT has no attention norm and no key for one
        self.attention_norm = attention_norm if attention_norm is not None else nn.Identity()
        self.has_cross_attention = crossattention is not None
        if crossattention is not None:
            self.crossattention = crossattention
            self.crossattention_norm = crossattention_norm
        self.feedforward_norm = feedforward_norm
        self.output_closes_residual = getattr(self.output, "closes_residual", False)

    def forward(
        self,
        hidden_states: torch.Tensor,  # [b, q, H]
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        context: LayerContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        ctx = context or LayerContext()
        attended, weights = self_attend(
            self.attention, self.attention_norm(hidden_states), mask, positions, head_mask, output_attentions, ctx
        )
        hidden_states = hidden_states + attended
        cross_weights = None
        if self.has_cross_attention:
            crossed, cross_weights = cross_attend(
                self.crossattention,
                self.crossattention_norm(hidden_states),
                positions,
                head_mask,
                output_attentions,
                ctx,
            )
            hidden_states = hidden_states + crossed
        normed = self.feedforward_norm(hidden_states)
        if self.output_closes_residual:  # the output adds the residual itself (X-MOD's pre-norm adapters after it)
            return run_feedforward(self, normed, ctx, hidden_states, norm=self.feedforward_norm), weights, cross_weights
        # the feed-forward sub-layer has no norm here: it returns dropout(dense2(...)), the layer adds the residual
        hidden_states = hidden_states + run_feedforward(self, normed, ctx)
        return hidden_states, weights, cross_weights


class ParallelLayer(_ResidualLayer):
    """``x + attn(norm(x)) + ff(norm(x))``: both branches read the same input (one matmul pass per layer)."""

    def __init__(
        self,
        attention: Attention,
        feedforward: FeedForward,
        norm: nn.Module,
        feedforward_norm: nn.Module | None = None,
        chunk_size_feed_forward: int = 0,
    ) -> None:
        super().__init__(attention, feedforward, chunk_size_feed_forward)
        self.shared_norm = feedforward_norm is None
        if self.shared_norm:
            self.norm = norm
        else:
            self.attention_norm = norm
            self.feedforward_norm = feedforward_norm

    def forward(
        self,
        hidden_states: torch.Tensor,  # [b, q, H]
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        context: LayerContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        ctx = context or LayerContext()
        if self.shared_norm:
            attention_in = feedforward_in = self.norm(hidden_states)
        else:
            attention_in, feedforward_in = self.attention_norm(hidden_states), self.feedforward_norm(hidden_states)
        attended, weights = self_attend(
            self.attention, attention_in, mask, positions, head_mask, output_attentions, ctx
        )
        return hidden_states + attended + run_feedforward(self, feedforward_in, ctx), weights, None


# --------------------------------------------------------------------------------------------- factories
def build_post_ln(
    *,
    attention: SublayerFactory,
    crossattention: SublayerFactory | None,
    feedforward: SublayerFactory,
    norm: Callable[[], nn.Module],
    chunk_size_feed_forward: int,
    **_: Any,
) -> TransformerLayer:
    return TransformerLayer(
        attention(norm),
        feedforward(norm),
        chunk_size_feed_forward,
        crossattention(norm) if crossattention is not None else None,
    )


def build_pre_ln(
    *,
    attention: SublayerFactory,
    crossattention: SublayerFactory | None,
    feedforward: SublayerFactory,
    norm: Callable[[], nn.Module],
    chunk_size_feed_forward: int,
    layer_index: int,
    options: PreLNOptions,
    **_: Any,
) -> PreLNLayer:
    skip = layer_index == 0 and not options.first_attention_norm
    return PreLNLayer(
        attention(None),
        feedforward(None),
        None if skip else norm(),
        norm(),
        chunk_size_feed_forward,
        crossattention(None) if crossattention is not None else None,
        norm() if crossattention is not None else None,
    )


def build_parallel(
    *,
    attention: SublayerFactory,
    crossattention: SublayerFactory | None,
    feedforward: SublayerFactory,
    norm: Callable[[], nn.Module],
    chunk_size_feed_forward: int,
    options: ParallelOptions,
    **_: Any,
) -> ParallelLayer:
    if crossattention is not None:  # refused at validate (check_no_cross_attention); kept for direct callers
        raise InputError("a parallel layer has no cross-attention sub-layer")
    return ParallelLayer(
        attention(None), feedforward(None), norm(), None if options.shared_norm else norm(), chunk_size_feed_forward
    )


# ------------------------------------------------------------------------------------ whole-config checks
def check_post_ln(config: BertConfig, spec: ComponentSpec, loc: str) -> list[ConfigIssue]:
    if getattr(spec, "final_norm", None):
        return [
            ConfigIssue(
                f"{loc}.final_norm",
                "a post_ln stack already ends with a norm (each sub-layer's); a final norm needs layer pre_ln or "
                "parallel",
            )
        ]
    return []


def check_parallel(config: BertConfig, spec: ComponentSpec, loc: str) -> list[str]:
    if config.add_cross_attention:
        return ["a parallel layer has no cross-attention sub-layer (add_cross_attention: true); use pre_ln or post_ln"]
    return []


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "layer",
            "post_ln",
            build_post_ln,
            description="BERT: norm(x + attn(x)), norm(x + ff(x))",
            validate=check_post_ln,
        ),
        Component("layer", "pre_ln", build_pre_ln, PreLNOptions, description="x + attn(norm(x)), x + ff(norm(x))"),
        Component(
            "layer",
            "parallel",
            build_parallel,
            ParallelOptions,
            description="x + attn(norm(x)) + ff(norm(x))",
            validate=check_parallel,
        ),
    ]
