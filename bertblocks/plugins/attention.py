"""BERT multi-head attention: projections, optional relative-position bias, a backend kernel, output
projection with residual and LayerNorm.

Module names are HF's (``attention.self.query``, ``attention.output.LayerNorm``, …) so checkpoints load
unchanged; ``LayerNorm`` is CamelCase for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bertblocks.core.cache import KVCache
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Attention, AttentionBackend, PositionBias, Positions, PositionScheme
from bertblocks.core.packing import Packing


class SelfAttentionProjections(nn.Module):
    """HF's ``BertSelfAttention`` parameters: ``query``, ``key``, ``value`` (and ``distance_embedding``)."""

    def __init__(self, hidden_size: int, all_head_size: int, bias: PositionBias | None) -> None:
        super().__init__()
        self.query = nn.Linear(hidden_size, all_head_size)
        self.key = nn.Linear(hidden_size, all_head_size)
        self.value = nn.Linear(hidden_size, all_head_size)
        self.position_bias_name = bias.module_name if bias is not None else None
        if bias is not None:
            self.add_module(bias.module_name, bias)

    @property
    def position_bias(self) -> PositionBias | None:
        return getattr(self, self.position_bias_name) if self.position_bias_name else None


class AttentionOutput(nn.Module):
    """HF's ``BertSelfOutput``: ``LayerNorm(dropout(dense(x)) + residual)``.

    Without a norm (``norm=None``: a pre-LN or parallel layer adds the residual and owns the norm) it returns
    ``dropout(dense(x))`` and ignores ``residual``.
    """

    def __init__(
        self,
        all_head_size: int,
        hidden_size: int,
        layer_norm_eps: float,
        dropout: float,
        norm: nn.Module | str | None = "layernorm",
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(all_head_size, hidden_size)
        if norm == "layernorm":  # the default of direct callers (before norms were a component)
            norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.post_norm = norm is not None
        if isinstance(norm, nn.Module):
            self.LayerNorm = norm  # CamelCase: HF's checkpoint key, whatever the norm kind
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out = self.dropout(self.dense(hidden_states))
        return self.LayerNorm(out + residual) if self.post_norm else out


class BertAttention(Attention):
    """Multi-head self-attention as in BERT.

    Shapes::

        hidden [b, q, H] → Q, K, V [b, h, q, d] → backend → [b, h, q, d] → [b, q, h·d] → output [b, q, H]

    Args:
        hidden_size: ``H``.
        num_heads: ``h``; ``d = H // h``.
        dropout: attention-probability dropout.
        hidden_dropout: dropout before the residual.
        layer_norm_eps: LayerNorm epsilon.
        backend: the kernel, chosen once at build time.
        position_bias: relative-position score term for this layer, or ``None``.
        norm: the norm after the residual (``output.LayerNorm``, post-LN); ``None`` for a layer that normalises
            itself (pre-LN, parallel): the sub-layer then returns ``dropout(dense(context))`` alone.
    """

    def __init__(
        self,
        *,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        hidden_dropout: float,
        layer_norm_eps: float,
        backend: AttentionBackend,
        position_bias: PositionBias | None,
        norm: nn.Module | str | None = "layernorm",
    ) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"num_heads {num_heads} must divide hidden_size {hidden_size}")
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.scale = self.head_dim**-0.5
        self.dropout_p = dropout
        self.backend = backend
        # `self` is HF's name for this child; kept for checkpoint compatibility.
        self.self = SelfAttentionProjections(hidden_size, num_heads * self.head_dim, position_bias)
        self.output = AttentionOutput(num_heads * self.head_dim, hidden_size, layer_norm_eps, hidden_dropout, norm)
        self.original_num_heads = num_heads
        self.kept_heads: list[int] = list(range(num_heads))  # original numbers of the heads still here
        self.register_buffer("kept_head_index", torch.arange(num_heads), persistent=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        encoder_hidden_states: torch.Tensor | None = None,
        cache: KVCache | None = None,
        layer_index: int = 0,
        is_causal: bool = False,
        packing: Packing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if packing is not None:
            return self._packed(hidden_states, mask, positions, head_mask, output_attentions, packing)
        b, q, _ = hidden_states.shape
        h, d = self.num_heads, self.head_dim
        proj = self.self
        query = self._heads(proj.query(hidden_states))  # [b, h, q, d]

        if encoder_hidden_states is not None:
            # Cross-attention: keys/values from the encoder, computed once per cache and reused every step.
            cached = cache.cross(layer_index) if cache is not None else None
            if cached is None:
                cached = (self._heads(proj.key(encoder_hidden_states)), self._heads(proj.value(encoder_hidden_states)))
                if cache is not None:
                    cache.set_cross(layer_index, *cached)
            key, value = cached  # [b, h, s, d]
        else:
            key = self._heads(proj.key(hidden_states))
            value = self._heads(proj.value(hidden_states))
            if cache is not None:
                key, value = cache.update(layer_index, key, value)  # [b, h, past + q, d]

        context, weights = self._attend(query, key, value, mask, positions, head_mask, output_attentions, is_causal)
        context = context.transpose(1, 2).reshape(b, q, h * d)  # [b, q, h·d]
        return self.output(context, hidden_states), weights

    def _attend(
        self,
        query: torch.Tensor,  # [b, h, q, d]
        key: torch.Tensor,  # [b, h, k, d]
        value: torch.Tensor,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        is_causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Position bias, backend, head mask: ``[b, h, q, d]`` context and optional probabilities."""
        if mask is not None and not self.backend.capabilities.additive_mask:
            raise ValueError(
                f"attention backend {self.backend.name!r} takes no attention mask, but this batch is padded "
                "(or masked); pass unpadded inputs, or choose a backend that takes masks (eager, sdpa)"
            )
        bias = self.self.position_bias
        if bias is not None:
            # HF computes (QKᵀ + bias) / √d; the backend scales QKᵀ itself, so the bias is scaled here and
            # travels in the additive mask, which every backend (SDPA included) accepts.
            term = bias(query, key, positions) * self.scale  # [b, h, q, k]
            mask = term if mask is None else term + mask
        context, weights = self.backend(
            query,
            key,
            value,
            mask=mask,
            scale=self.scale,
            dropout_p=self.dropout_p if self.training else 0.0,
            # one new query sees every cached key: nothing to hide
            is_causal=is_causal and query.shape[2] > 1,
            need_weights=output_attentions,
        )
        if head_mask is not None:
            # Scaling a head's probabilities scales its output by the same factor, so the mask is applied
            # to the [b, h, q, d] output and the fused kernel stays usable.
            if self.num_heads != self.original_num_heads:
                head_mask = head_mask[self.kept_head_index]
            factor = head_mask.view(1, self.num_heads, 1, 1)
            context = context * factor
            weights = weights * factor if weights is not None else None
        return context, weights

    def _packed(
        self,
        hidden_states: torch.Tensor,  # [1, T, H] real tokens only
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        packing: Packing,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Projections on the real tokens; attention per sequence (varlen) or in the padded layout."""
        proj = self.self
        h, d = self.num_heads, self.head_dim
        q, k, v = proj.query(hidden_states[0]), proj.key(hidden_states[0]), proj.value(hidden_states[0])  # [T, h·d]
        caps = self.backend.capabilities
        if caps.varlen and proj.position_bias is None and head_mask is None and not output_attentions:
            t = q.shape[0]
            context = self.backend.varlen(
                q.view(t, h, d),
                k.view(t, h, d),
                v.view(t, h, d),
                cu_seqlens=packing.cu_seqlens,
                max_seqlen=packing.max_seqlen,
                scale=self.scale,
                dropout_p=self.dropout_p if self.training else 0.0,
            ).reshape(t, h * d)
            return self.output(context[None], hidden_states), None
        # Re-pad Q/K/V for this call only: [T, h·d] → [b, h, L, d]. Padded query rows are zeros and are
        # dropped again below; padded keys are hidden by the mask as usual.
        query, key, value = (self._heads(packing.unpack(x)) for x in (q, k, v))
        context, weights = self._attend(query, key, value, mask, positions, head_mask, output_attentions, False)
        b, _, length, _ = context.shape
        context = packing.pack(context.transpose(1, 2).reshape(b, length, h * d))  # [T, h·d]
        return self.output(context[None], hidden_states), weights

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, t, h·d]`` → ``[b, h, t, d]``."""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def prune_heads(self, heads: set[int]) -> None:
        drop = {head for head in heads if head in self.kept_heads}
        if not drop:
            return
        keep_now = [i for i, head in enumerate(self.kept_heads) if head not in drop]  # current numbering
        if not keep_now:
            raise ValueError("cannot prune every head of a layer")
        d = self.head_dim
        index = torch.cat([torch.arange(i * d, (i + 1) * d) for i in keep_now]).to(self.self.query.weight.device)
        for name in ("query", "key", "value"):
            setattr(self.self, name, _select_linear(getattr(self.self, name), index, dim=0))
        self.output.dense = _select_linear(self.output.dense, index, dim=1)
        self.kept_heads = [self.kept_heads[i] for i in keep_now]
        self.num_heads = len(self.kept_heads)
        self.kept_head_index = torch.tensor(self.kept_heads, device=self.kept_head_index.device)


def _select_linear(layer: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A copy of ``layer`` keeping only ``index`` along ``dim`` of its weight (0 = outputs, 1 = inputs)."""
    weight = layer.weight.index_select(dim, index).detach().clone()
    bias = layer.bias.detach().clone() if dim == 1 else layer.bias.index_select(0, index).detach().clone()
    new = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        new.bias.copy_(bias)
    new.weight.requires_grad_(layer.weight.requires_grad)
    new.bias.requires_grad_(layer.bias.requires_grad)
    return new


def build_bert_attention(
    *,
    hidden_size: int,
    num_heads: int,
    dropout: float,
    hidden_dropout: float,
    layer_norm_eps: float,
    backend: AttentionBackend,
    position: PositionScheme,
    options: object,
    norm: Callable[[], nn.Module] | str | None = "layernorm",
) -> BertAttention:
    head_dim = hidden_size // num_heads
    return BertAttention(
        hidden_size=hidden_size,
        num_heads=num_heads,
        dropout=dropout,
        hidden_dropout=hidden_dropout,
        layer_norm_eps=layer_norm_eps,
        backend=backend,
        position_bias=position.attention_bias(num_heads, head_dim),
        norm=norm() if callable(norm) else norm,
    )


def bertblocks_register_components() -> list[Component]:
    return [Component("attention", "bert", build_bert_attention, description="BERT multi-head attention")]
