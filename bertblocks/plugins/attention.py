"""BERT multi-head attention: projections, the position scheme's terms (score bias, rotation of queries and
keys), a backend kernel, output projection with residual and LayerNorm.

Module names are HF's (``attention.self.query``, ``attention.output.LayerNorm``, …) so checkpoints load
unchanged; ``LayerNorm`` is CamelCase for the same reason. Options: biases of the projections on or off
(``qkv_bias``, ``output_bias``), one fused ``[3·h·d, H]`` projection (``fused_qkv``, key ``self.Wqkv``,
the layout ModernBERT stores: all query rows, then key rows, then value rows; or ``qkv_layout: heads``, per
head its query, key and value rows, as NeoBERT's ``qkv``), and grouped-query attention
(``num_kv_heads``: fewer key/value heads, each shared by ``h / num_kv_heads`` consecutive query heads, as
transformers' ``repeat_kv``; the cache holds the ``num_kv_heads`` heads). ``qv_bias`` gives the query and the value
biases of their own (``self.q_bias``, ``self.v_bias``) and the key none, as DeBERTa v1 stores them beside its
bias-free fused ``in_proj``. ``value_input_size`` lets the value projection read a wider input than the query
and key (MobileBERT's bottleneck layers: queries and keys from the bottlenecked states, values from the layer's full
input): the attention's input is then both, concatenated ``[..., H + value_input_size]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.config import BertConfig, ComponentSpec
from bertblocks.core.cache import KVCache
from bertblocks.core.capabilities import AttentionCapabilities, CapabilityError
from bertblocks.core.component import Component
from bertblocks.core.interfaces import (
    Attention,
    AttentionBackend,
    LayerPositionTerms,
    PackedScoreTerm,
    PositionBias,
    Positions,
    PositionScheme,
    Rotary,
)
from bertblocks.core.packing import Packing

from ..errors import InputError
from .projections import AttentionOutput, qkv_linears
from .varlen.biased import sdpa_varlen_biased  # noqa: F401 (registers the op torch.ops.bertblocks.sdpa_varlen_biased)
from .varlen.sdpa import equal_length_runs


class AttentionOptions(BaseModel):
    """Options of the ``bert`` attention."""

    model_config = ConfigDict(extra="forbid")

    qkv_bias: bool = Field(True, description="biases on the query, key and value projections")
    output_bias: bool = Field(True, description="bias on the output projection (attention.output.dense)")
    fused_qkv: bool = Field(False, description="one fused query/key/value projection (key self.Wqkv) instead of three")
    qkv_layout: Literal["blocks", "heads"] = Field(
        "blocks",
        description="rows of the fused Wqkv: blocks: all query rows, then key, then value (ModernBERT); heads: per "
        "head its query, key and value rows (NeoBERT's qkv)",
    )
    num_kv_heads: PositiveInt | None = Field(
        None,
        description="key/value heads (grouped-query attention; must divide num_heads); null: as many as num_heads",
    )
    qv_bias: bool = Field(
        False,
        description="query and value biases of their own (self.q_bias, self.v_bias), none on the key (DeBERTa v1); "
        "with qkv_bias false",
    )
    value_input_size: PositiveInt | None = Field(
        None,
        description="width of the value projection's input when it differs from the query and key's (MobileBERT's "
        "bottleneck: values from the layer's full input); the attention's input is then the query/key input and "
        "the value input concatenated. null: all three read the same input",
    )


class SelfAttentionProjections(nn.Module):
    """HF's ``BertSelfAttention`` parameters: ``query``, ``key``, ``value`` (or one fused ``Wqkv``), and the
    position scheme's per-layer modules (``distance_embedding``, ``rotary``)."""

    def __init__(
        self,
        hidden_size: int,
        all_head_size: int,
        bias: PositionBias | None,
        rotary: Rotary | None = None,
        *,
        qkv_bias: bool = True,
        fused: bool = False,
        kv_size: int | None = None,
        per_head: int | None = None,
        qv_bias: bool = False,
        value_input_size: int | None = None,
    ) -> None:
        super().__init__()
        if value_input_size is not None and fused:
            raise InputError("encoder.attention.value_input_size needs fused_qkv: false (the value reads other inputs)")
        self.fused = fused
        #: the split of a concatenated [query/key input | value input] (None: one input for all three)
        self.input_split = (hidden_size, value_input_size) if value_input_size is not None else None
        # fused rows grouped per head ([q_h; k_h; v_h] for each of `per_head` heads) rather than in three blocks
        self.per_head = per_head
        if fused:
            self.Wqkv = nn.Linear(hidden_size, 3 * all_head_size, bias=qkv_bias)  # ModernBERT's name
        else:
            self.query, self.key, self.value = qkv_linears(
                hidden_size, all_head_size, qkv_bias, kv_width=kv_size, value_input_size=value_input_size
            )
        # DeBERTa v1's biases beside the projections: the query's and the value's, none on the key (a key bias
        # adds the same q·b to every score of a query row, which the softmax ignores)
        self.q_bias = nn.Parameter(torch.zeros(all_head_size)) if qv_bias else None
        self.v_bias = nn.Parameter(torch.zeros(kv_size or all_head_size)) if qv_bias else None
        self.position_bias_name = bias.module_name if bias is not None else None
        if bias is not None:
            self.add_module(bias.module_name, bias)
        self.rotary = rotary

    @property
    def position_bias(self) -> PositionBias | None:
        return getattr(self, self.position_bias_name) if self.position_bias_name else None

    def project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[..., H]`` → query, key, value ``[..., h·d]`` each."""
        q, k, v = self._project(hidden_states)
        if self.q_bias is not None and self.v_bias is not None:
            q, v = q + self.q_bias, v + self.v_bias
        return q, k, v

    def _project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.fused and self.per_head:
            fused = self.Wqkv(hidden_states)
            lead, h = fused.shape[:-1], self.per_head
            q, k, v = fused.view(*lead, h, 3, -1).unbind(-2)  # [..., h, d] each
            return q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1)
        if self.fused:
            return self.Wqkv(hidden_states).chunk(3, dim=-1)
        if self.input_split is not None:
            query_key_input, value_input = hidden_states.split(self.input_split, dim=-1)
            return self.query(query_key_input), self.key(query_key_input), self.value(value_input)
        return self.query(hidden_states), self.key(hidden_states), self.value(hidden_states)

    def project_query(self, hidden_states: torch.Tensor) -> torch.Tensor:
        query = nn.functional.linear(hidden_states, *self._fused_part(0)) if self.fused else self.query(hidden_states)
        return query if self.q_bias is None else query + self.q_bias

    def project_key(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` → keys ``[..., h·d]`` (what a position term that reads the projections uses)."""
        if self.fused:
            return nn.functional.linear(hidden_states, *self._fused_part(1))
        return self.key(hidden_states)

    def project_key_value(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            key = nn.functional.linear(hidden_states, *self._fused_part(1))
            value = nn.functional.linear(hidden_states, *self._fused_part(2))
        else:
            key, value = self.key(hidden_states), self.value(hidden_states)
        return key, value if self.v_bias is None else value + self.v_bias

    def _fused_part(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = self.Wqkv.out_features // 3
        if self.per_head:  # the i-th d rows of every head's 3·d
            rows = torch.arange(3 * n, device=self.Wqkv.weight.device).view(self.per_head, 3, -1)[:, i].reshape(-1)
            bias = self.Wqkv.bias[rows] if self.Wqkv.bias is not None else None
            return self.Wqkv.weight[rows], bias
        bias = self.Wqkv.bias[i * n : (i + 1) * n] if self.Wqkv.bias is not None else None
        return self.Wqkv.weight[i * n : (i + 1) * n], bias


class BertAttention(Attention):
    """Multi-head self-attention as in BERT.

    Shapes::

        hidden [b, q, H] → Q, K, V [b, q, h, d] → (rotary) → [b, h, q, d] → (cache) → backend
        → [b, h, q, d] → [b, q, h·d] → output [b, q, H]

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
        rotary: rotation of queries and keys for this layer, or ``None``.
        qkv_bias, output_bias, fused_qkv, qkv_layout, num_kv_heads, qv_bias, value_input_size: see
            :class:`AttentionOptions`.
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
        rotary: Rotary | None = None,
        qkv_bias: bool = True,
        output_bias: bool = True,
        fused_qkv: bool = False,
        num_kv_heads: int | None = None,
        qkv_layout: str = "blocks",
        qv_bias: bool = False,
        value_input_size: int | None = None,
    ) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise InputError(f"num_heads {num_heads} must divide hidden_size {hidden_size}")
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        if self.num_kv_heads != num_heads:
            # declared, so that pruned_heads is refused at build and prune_heads with this reason
            self.capabilities = AttentionCapabilities(
                pruning=False, reason="grouped-query attention: each key/value head serves several query heads"
            )
        if num_heads % self.num_kv_heads:
            raise InputError(f"encoder.attention.num_kv_heads {num_kv_heads} must divide num_heads {num_heads}")
        if qkv_layout == "heads" and not fused_qkv:
            raise InputError("encoder.attention.qkv_layout 'heads' orders a fused Wqkv's rows: set fused_qkv: true")
        if qv_bias and qkv_bias:
            raise InputError(
                "encoder.attention.qv_bias gives the query and value their own biases: set qkv_bias: false"
            )
        grouped = self.num_kv_heads != num_heads
        if grouped and fused_qkv:
            raise InputError("encoder.attention.num_kv_heads (grouped-query attention) needs fused_qkv: false")
        if grouped and position_bias is not None and position_bias.reads_projections:
            raise InputError(
                "encoder.attention.num_kv_heads (grouped-query attention) cannot be combined with a position term "
                "that projects through the layer's keys (disentangled attention)"
            )
        # a position term may widen the denominator (DeBERTa: √(d · (1 + number of position terms)))
        factor = position_bias.score_scale_factor if position_bias is not None else 1.0
        self.scale = (self.head_dim * factor) ** -0.5
        self.dropout_p = dropout
        self.backend = backend
        # `self` is HF's name for this child; kept for checkpoint compatibility.
        self.self = SelfAttentionProjections(
            hidden_size,
            num_heads * self.head_dim,
            position_bias,
            rotary,
            qkv_bias=qkv_bias,
            fused=fused_qkv,
            kv_size=self.num_kv_heads * self.head_dim,
            per_head=num_heads if fused_qkv and qkv_layout == "heads" else None,
            qv_bias=qv_bias,
            value_input_size=value_input_size,
        )
        self.output = AttentionOutput(
            num_heads * self.head_dim, hidden_size, layer_norm_eps, hidden_dropout, norm, bias=output_bias
        )
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
        if output_attentions and not self.backend.capabilities.attention_weights:
            # the backend would return None and output_attentions an empty tuple, silently
            raise CapabilityError(
                f"output_attentions=True, but attention backend {self.backend.name!r} cannot return attention "
                "weights (its capabilities say attention_weights: false): load the model with "
                "attn_implementation='eager' (or set encoder.attention.backend: eager or sdpa) to get them, "
                "or drop output_attentions"
            )
        if packing is not None:
            return self._packed(hidden_states, mask, positions, head_mask, output_attentions, packing)
        b, q, _ = hidden_states.shape
        h, d = self.num_heads, self.head_dim
        proj = self.self

        if encoder_hidden_states is not None:
            # Cross-attention: keys/values from the encoder, computed once per cache and reused every step.
            query = self._heads(proj.project_query(hidden_states))  # [b, h, q, d]
            cached = cache.cross(layer_index) if cache is not None else None
            if cached is None:
                k, v = proj.project_key_value(encoder_hidden_states)
                cached = (self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads))
                if cache is not None:
                    cache.set_cross(layer_index, *cached)
            key, value = cached  # [b, kv, s, d]
        else:
            query, key, value = proj.project(hidden_states)
            kv = self.num_kv_heads
            query, key, value = query.view(b, q, h, d), key.view(b, q, kv, d), value.view(b, q, kv, d)  # [b, q, ·, d]
            if proj.rotary is not None:
                # Keys are rotated by their own positions *before* they are cached: a cache then holds keys
                # exactly as a single pass over the whole sequence would have them.
                query, key = proj.rotary(query, key, positions.tokens(), positions.memo)
                if proj.rotary.rotates_value:
                    value = proj.rotary.rotate_value(value, positions.tokens(), positions.memo)
            query, key, value = (x.transpose(1, 2) for x in (query, key, value))  # [b, h, q, d]
            if cache is not None:
                key, value = cache.update(layer_index, key, value)  # [b, kv, past + q, d]
        key, value = self._share_kv(key), self._share_kv(value)  # [b, h, ·, d]

        self_attention = encoder_hidden_states is None
        context, weights = self._attend(
            query, key, value, mask, positions, head_mask, output_attentions, is_causal, self_attention
        )
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
        self_attention: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Position biases, backend, head mask: ``[b, h, q, d]`` context and optional probabilities."""
        if mask is not None and not self.backend.capabilities.additive_mask:
            raise InputError(
                f"attention backend {self.backend.name!r} takes no attention mask, but this batch is padded "
                "(or masked); pass unpadded inputs, or choose a backend that takes masks (eager, sdpa)"
            )
        bias = self.self.position_bias
        if bias is not None:
            # HF computes (QKᵀ + bias) / √d; the backend scales QKᵀ itself, so the bias is scaled here and
            # travels in the additive mask, which every backend (SDPA included) accepts.
            if bias.reads_projections:  # the term projects its own inputs with this layer's weights
                term = bias(query, key, positions, projections=self.self) * self.scale  # [b, h, q, k]
            else:
                term = bias(query, key, positions) * self.scale  # [b, h, q, k]
            mask = term if mask is None else term + mask
        shared = positions.score_bias if self_attention else None
        if shared is not None:
            # Computed once for every layer over the heads as built; a pruned layer keeps its heads' rows.
            if self.num_heads != self.original_num_heads:
                shared = shared.index_select(1, self.kept_head_index)
            mask = shared if mask is None else shared + mask
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
        t, kv = hidden_states.shape[1], self.num_kv_heads
        q, k, v = proj.project(hidden_states)
        q, k, v = q.view(1, t, h, d), k.view(1, t, kv, d), v.view(1, t, kv, d)  # [1, T, ·, d]
        if proj.rotary is not None:
            # each packed sequence is rotated by its own positions (from 0), as it would be alone
            q, k = proj.rotary(q, k, positions.tokens(packed=True), positions.memo)
            if proj.rotary.rotates_value:
                v = proj.rotary.rotate_value(v, positions.tokens(packed=True), positions.memo)
        if (
            self.backend.accepts_varlen(dropout_p=self.dropout_p if self.training else 0.0)
            and proj.position_bias is None
            and positions.score_bias is None
            and head_mask is None
            and not output_attentions
        ):
            context = self.backend.varlen(
                q[0],
                self._share_kv(k[0], dim=1),  # [T, h, d]
                self._share_kv(v[0], dim=1),
                cu_seqlens=packing.cu_seqlens,
                max_seqlen=packing.max_seqlen,
                scale=self.scale,
                dropout_p=self.dropout_p if self.training else 0.0,
            ).reshape(t, h * d)
            return self.output(context[None], hidden_states), None
        if not output_attentions and self._biased_per_sequence(positions):
            query, key, value = q[0], self._share_kv(k[0], dim=1), self._share_kv(v[0], dim=1)  # [T, h, d]
            if not torch.compiler.is_compiling():
                context = self._attend_per_sequence(query, key, value, positions, head_mask, packing)
                return self.output(context.reshape(t, h * d)[None], hidden_states), None
            compiled = self._attend_per_sequence_compiled(query, key, value, positions, head_mask, packing)
            if compiled is not None:
                return self.output(compiled.reshape(t, h * d)[None], hidden_states), None
        context, weights = self._attend_repadded(q, k, v, mask, positions, head_mask, output_attentions, packing)
        return self.output(context[None], hidden_states), weights

    def _attend_repadded(
        self,
        q: torch.Tensor,  # [1, T, h, d]
        k: torch.Tensor,  # [1, T, kv, d]
        v: torch.Tensor,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        packing: Packing,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Q/K/V re-padded for this call only, ``[T, ·] → [b, h, L, d]``, attended as a padded batch: ``[T, h·d]``
        context and optional probabilities. Padded query rows are zeros and are dropped again; padded keys are
        hidden by the mask as usual."""
        h, d, kv = self.num_heads, self.head_dim, self.num_kv_heads
        t = q.shape[1]
        query = self._heads(packing.unpack(q[0].reshape(t, h * d)))  # [b, h, L, d]
        key, value = (self._share_kv(self._heads(packing.unpack(x[0].reshape(t, kv * d)), kv)) for x in (k, v))
        context, weights = self._attend(query, key, value, mask, positions, head_mask, output_attentions, False)
        b, _, length, _ = context.shape
        return packing.pack(context.transpose(1, 2).reshape(b, length, h * d)), weights  # [T, h·d]

    def _biased_per_sequence(self, positions: Positions) -> bool:
        """Whether this packed call attends sequence by sequence with each one's own score term rather than
        re-padded: a score term is there and every one is computable per sequence (a per-layer term that declares
        ``per_sequence``; a shared bias broadcast over the batch, whose ``[:l, :l]`` corner is any right-padded
        row's). Eagerly :meth:`_attend_per_sequence` runs; in a compiled graph
        :meth:`_attend_per_sequence_compiled`, which may still decline (and the call re-pads)."""
        bias, shared = self.self.position_bias, positions.score_bias
        if bias is None and shared is None:
            return False
        if bias is not None and not bias.packs_per_sequence():
            return False
        return shared is None or shared.shape[0] == 1

    def _attend_per_sequence_compiled(
        self,
        query: torch.Tensor,  # [T, h, d]
        key: torch.Tensor,
        value: torch.Tensor,
        positions: Positions,
        head_mask: torch.Tensor | None,
        packing: Packing,
    ) -> torch.Tensor | None:
        """Inside a compiled graph: the per-sequence attention as one custom op (``bertblocks::sdpa_varlen_biased``,
        :mod:`bertblocks.plugins.varlen.biased`) that takes every sequence's term at once (the layer's
        :meth:`PositionBias.packed_term`, scaled, plus the shared bias): ``[T, h, d]`` context, or ``None`` where
        the call must re-pad: the term gives no packed form, the backend's kernel is not SDPA's (the op computes
        SDPA's), attention dropout in training (the op's backward recomputes the forward), or an export (standard
        ops only)."""
        if not self.backend.accepts_varlen(dropout_p=self.dropout_p if self.training else 0.0):
            return None
        if torch.compiler.is_exporting():
            return None
        bias, shared = self.self.position_bias, positions.score_bias
        term = PackedScoreTerm()
        if bias is not None:
            extra = {"projections": self.self} if bias.reads_projections else {}
            found = bias.packed_term(query, key, positions, **extra)
            if found is None:
                return None
            term = found
        # HF scales the per-layer term with the scores ((QKᵀ + bias) / √d: the op scales rows and cols itself); the
        # shared bias is added to the scaled scores
        fixed = term.fixed * self.scale if term.fixed is not None else None
        if shared is not None:
            if self.num_heads != self.original_num_heads:
                shared = shared.index_select(1, self.kept_head_index)  # a pruned layer keeps its heads' rows
            fixed = shared if fixed is None else fixed + shared
        if fixed is not None:
            fixed = fixed.to(query.dtype).expand(1, self.num_heads, -1, -1)
        out = torch.ops.bertblocks.sdpa_varlen_biased(
            query, key, value, packing.cu_seqlens, self.scale, self.scale, term.index, term.rows, term.cols, fixed
        )
        if head_mask is not None:
            if self.num_heads != self.original_num_heads:
                head_mask = head_mask[self.kept_head_index]
            out = out * head_mask.view(1, self.num_heads, 1)
        return out

    def _attend_per_sequence(
        self,
        query: torch.Tensor,  # [T, h, d]
        key: torch.Tensor,
        value: torch.Tensor,
        positions: Positions,
        head_mask: torch.Tensor | None,
        packing: Packing,
    ) -> torch.Tensor:
        """Attention within each packed sequence with its own score term as the mask: ``[T, h, d]`` context.

        Each run of equal-length neighbours is one backend call ``[n, h, l, d]`` whose additive mask is the
        sequences' ``[n|1, h, l, l]`` term (scaled per-layer term plus the shared bias's corner): ``Σ lᵢ²`` work
        and no padding mask, where re-padding costs ``b·L²`` and a masked call over padding (on CPU a third of
        the time, see docs/explanation/packing.md). Eager packing is right-padded, so sequence ``i`` sits at
        positions ``0 … lᵢ - 1`` in the padded path too: its term there is exactly this one.
        """
        bias = self.self.position_bias
        terms = None
        if bias is not None:
            extra = {"projections": self.self} if bias.reads_projections else {}
            terms = bias.sequence_terms(query, key, positions, **extra)
        shared = positions.score_bias
        if shared is not None and self.num_heads != self.original_num_heads:
            shared = shared.index_select(1, self.kept_head_index)  # a pruned layer keeps its heads' rows
        dropout_p = self.dropout_p if self.training else 0.0
        out = torch.zeros_like(query)  # sequences of length 0 have no token; nothing else stays zero
        for start, count, length in equal_length_runs(packing.cu_seqlens):
            span = slice(start, start + count * length)
            q, k, v = (x[span].unflatten(0, (count, length)).transpose(1, 2) for x in (query, key, value))
            mask = terms(start, count, length) * self.scale if terms is not None else None  # [n, h, l, l]
            if shared is not None:
                corner = shared[:, :, :length, :length]
                mask = corner if mask is None else mask + corner
            context, _ = self.backend(
                q, k, v, mask=mask, scale=self.scale, dropout_p=dropout_p, is_causal=False, need_weights=False
            )
            out[span] = context.transpose(1, 2).flatten(0, 1)
        if head_mask is not None:
            if self.num_heads != self.original_num_heads:
                head_mask = head_mask[self.kept_head_index]
            out = out * head_mask.view(1, self.num_heads, 1)
        return out

    def _heads(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """``[b, t, n·d]`` → ``[b, n, t, d]`` (``n``: ``heads``, default the query heads)."""
        b, t, _ = x.shape
        return x.view(b, t, heads or self.num_heads, self.head_dim).transpose(1, 2)

    def _share_kv(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Grouped-query attention: each of the ``kv`` heads along ``dim`` repeated for its ``h / kv`` consecutive
        query heads (transformers' ``repeat_kv``); unchanged without grouping."""
        if self.num_kv_heads == self.num_heads:
            return x
        return x.repeat_interleave(self.num_heads // self.num_kv_heads, dim=dim)

    def prune_heads(self, heads: set[int]) -> None:
        drop = {head for head in heads if head in self.kept_heads}
        if not drop:
            return
        if self.num_kv_heads != self.num_heads:
            raise InputError("pruning heads of grouped-query attention (num_kv_heads) is not supported")
        keep_now = [i for i, head in enumerate(self.kept_heads) if head not in drop]  # current numbering
        if not keep_now:
            raise InputError("cannot prune every head of a layer")
        d = self.head_dim
        device = self.output.dense.weight.device
        index = torch.cat([torch.arange(i * d, (i + 1) * d) for i in keep_now]).to(device)
        if self.self.fused and self.self.per_head:  # each kept head's 3·d rows
            fused_index = torch.cat([torch.arange(i * 3 * d, (i + 1) * 3 * d) for i in keep_now]).to(device)
            self.self.Wqkv = _select_linear(self.self.Wqkv, fused_index, dim=0)
            self.self.per_head = len(keep_now)
        elif self.self.fused:
            width = self.num_heads * d  # rows per block of the fused [q; k; v] projection
            fused_index = torch.cat([index, index + width, index + 2 * width])
            self.self.Wqkv = _select_linear(self.self.Wqkv, fused_index, dim=0)
        else:
            for name in ("query", "key", "value"):
                setattr(self.self, name, _select_linear(getattr(self.self, name), index, dim=0))
        for name in ("q_bias", "v_bias"):
            bias = getattr(self.self, name)
            if bias is not None:
                kept = nn.Parameter(bias.detach().index_select(0, index).clone(), requires_grad=bias.requires_grad)
                setattr(self.self, name, kept)
        self.output.dense = _select_linear(self.output.dense, index, dim=1)
        self.kept_heads = [self.kept_heads[i] for i in keep_now]
        self.num_heads = len(self.kept_heads)
        self.num_kv_heads = self.num_heads  # ungrouped (refused above otherwise): one key/value head per query head
        self.kept_head_index = torch.tensor(self.kept_heads, device=self.kept_head_index.device)


def _select_linear(layer: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A copy of ``layer`` keeping only ``index`` along ``dim`` of its weight (0 = outputs, 1 = inputs); a layer
    without bias stays without."""
    weight = layer.weight.index_select(dim, index).detach().clone()
    new = nn.Linear(
        weight.shape[1], weight.shape[0], bias=layer.bias is not None, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        new.weight.copy_(weight)
    new.weight.requires_grad_(layer.weight.requires_grad)
    if layer.bias is not None:
        bias = layer.bias.detach().clone() if dim == 1 else layer.bias.index_select(0, index).detach().clone()
        with torch.no_grad():
            new.bias.copy_(bias)
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
    options: AttentionOptions | BaseModel,
    layer_index: int = 0,  # callers from before layers were told their index: only per-layer schemes differ
    norm: Callable[[], nn.Module] | str | None = "layernorm",
) -> BertAttention:
    head_dim = hidden_size // num_heads
    if not isinstance(options, AttentionOptions):
        # a plugin wrapping this factory with options of its own (written before BERT's attention had options)
        # gets BERT's defaults
        options = AttentionOptions()
    terms: LayerPositionTerms = position.layer_terms(layer_index, num_heads, head_dim)
    return BertAttention(
        hidden_size=hidden_size,
        num_heads=num_heads,
        dropout=dropout,
        hidden_dropout=hidden_dropout,
        layer_norm_eps=layer_norm_eps,
        backend=backend,
        position_bias=terms.bias,
        norm=norm() if callable(norm) else norm,
        rotary=terms.rotary,
        qkv_bias=options.qkv_bias,
        output_bias=options.output_bias,
        fused_qkv=options.fused_qkv,
        num_kv_heads=options.num_kv_heads,
        qkv_layout=options.qkv_layout,
        qv_bias=options.qv_bias,
        value_input_size=options.value_input_size,
    )


#: layer kinds that hand the attention its query/key input and a wider value input concatenated
#: (``value_input_size``); any other layer hands it one input
VALUE_INPUT_LAYERS = frozenset({"bottleneck"})


def check_bert_attention(config: BertConfig, spec: ComponentSpec, loc: str) -> list[str]:
    if spec.options().get("value_input_size") is None:
        return []
    enc = config.encoder
    # the encoder-wide layer kind and those of the layers an override changes (not every layer: num_layers is
    # bounded only at build)
    changed = {i for o in enc.overrides if o.changes("layer") for i in o.layers if 0 <= i < enc.num_layers}
    layers = {enc.layer.name, *(enc.layer_spec(i, "layer").name for i in changed)}
    others = sorted(layers - VALUE_INPUT_LAYERS)
    if others:
        return [
            f"value_input_size needs a layer that hands the attention a separate value input "
            f"({', '.join(sorted(VALUE_INPUT_LAYERS))}); layer {', '.join(others)} hands it one input"
        ]
    return []


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "attention",
            "bert",
            build_bert_attention,
            AttentionOptions,
            description="multi-head attention: optional projection biases, fused QKV, position bias or rotary",
            validate=check_bert_attention,
        )
    ]
