"""Disentangled attention (DeBERTa-v2/v3): a position scheme usable in any model, not family-local code.

Three components, each through a documented extension point:

* position ``disentangled``: one table of relative-position embeddings ``[2·span, H]`` shared by every layer
  (:class:`RelativeTableTerm`, a :class:`~bertblocks.core.interfaces.SharedPositionTerm` at
  ``encoder.rel_embeddings``, with its LayerNorm when ``norm: true``), computed once per forward pass together
  with the log-bucketed relative positions (:class:`RelativeTable`, read by the layers from
  ``positions.term(RelativeTable)``); and in every self-attention layer a :class:`DisentangledBias` that projects
  the table with the layer's *own* query and key projections (``reads_projections``; or with its own
  ``pos_query_proj``/``pos_key_proj`` when ``share_att_key: false``) and adds the content→position (``c2p``)
  and position→content (``p2c``) terms. It widens the softmax denominator to ``√(d · (1 + terms))``
  (``score_scale_factor``). With ``absolute: true`` it also adds a learned absolute table to the embeddings
  (``position_biased_input``).
* pooler ``context_pooler``: DeBERTa's ``ContextPooler``: ``act(dense(h[:, 0]))`` with a chosen activation
  (``pooler_hidden_act``).

Shapes::

    table.embeddings [2·span, H]   table.relative [q, k] int64 (bucketed query - key)
    query, key [b, h, q|k, d]  →  c2p + p2c [b, h, q, k] (unscaled)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import (
    HeadProjections,
    LayerPositionTerms,
    ModelDims,
    PackedScoreTerm,
    Pooler,
    PositionBias,
    Positions,
    PositionScheme,
    SequenceTerms,
    SharedPositionTerm,
)
from bertblocks.plugins.feedforward import ACTIVATIONS

from ..errors import InputError

Term = Literal["c2p", "p2c"]


def log_bucket_position(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa's log buckets: distances below ``bucket_size // 2`` stay exact, longer ones grow logarithmically
    up to ``max_position`` (transformers' ``make_log_bucket_position``, operation for operation)."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    abs_pos = torch.where(
        (relative < mid) & (relative > -mid), torch.tensor(mid - 1).type_as(relative), torch.abs(relative)
    )
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative.type_as(log_pos), log_pos * sign)


@dataclass(frozen=True)
class RelativeTable:
    """What :class:`RelativeTableTerm` hands every layer once per pass.

    Attributes:
        embeddings: ``[2·span, H]`` the relative-position embeddings (normalised when the scheme says so).
        relative: ``[q, k]`` int64, the bucketed distance ``query - key`` of every pair.
        span: ``span`` (the table has ``2·span`` rows; row ``span + r`` is distance ``r``).
        contracting: every bucketed distance is at most the distance itself in magnitude, so pairs within
            ``positions.distance_range`` read only rows ``span + lo … span + hi`` (what a compiled graph projects).
    """

    embeddings: torch.Tensor
    relative: torch.Tensor
    span: int
    contracting: bool = False

    def __post_init__(self) -> None:
        if self.embeddings.dim() != 2 or self.embeddings.shape[0] != 2 * self.span:
            raise InputError(
                f"relative table must be [2·span = {2 * self.span}, H]; got {tuple(self.embeddings.shape)}"
            )
        if self.relative.dim() != 2:
            raise InputError(f"relative positions must be [q, k]; got {tuple(self.relative.shape)}")


class RelativeTableTerm(SharedPositionTerm):
    """The shared table ``encoder.rel_embeddings.weight`` (and ``encoder.rel_embeddings.LayerNorm``)."""

    module_name = "rel_embeddings"
    produces = RelativeTable

    def __init__(self, span: int, hidden_size: int, eps: float, norm: bool, buckets: int, max_relative: int) -> None:
        super().__init__()
        self.span, self.buckets, self.max_relative = span, buckets, max_relative
        mid = buckets // 2
        bucketed = buckets > 0 and max_relative > 0
        # The log bucket of |d| >= mid is ceil(f(|d|)) with f(mid) = mid, f concave and f'(mid) =
        # (mid - 1) / (mid · ln((max_relative - 1) / mid)): at most 1 makes f(|d|) <= |d|, and so its ceiling (|d| is
        # an integer). DeBERTa-v3's 256 buckets over 512 positions: f'(mid) = 0.72.
        self.contracting = not bucketed or (
            mid >= 1 and max_relative - 1 > mid and (mid - 1) / (mid * math.log((max_relative - 1) / mid)) < 1.0
        )
        self.weight = nn.Parameter(torch.empty(2 * span, hidden_size))
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=eps) if norm else None  # CamelCase: HF's key
        self.reset_parameters_like_hf(0.02)

    def reset_parameters_like_hf(self, std: float) -> None:
        with torch.no_grad():
            self.weight.normal_(0.0, std)

    def forward(self, positions: Positions, dtype: torch.dtype) -> RelativeTable:
        table = self.weight if self.LayerNorm is None else self.LayerNorm(self.weight)
        relative = positions.query[:, None] - positions.key[None, :]  # [q, k]
        if self.buckets > 0 and self.max_relative > 0:
            relative = log_bucket_position(relative, self.buckets, self.max_relative)
        return RelativeTable(table.to(dtype), relative.to(torch.long), self.span, self.contracting)


class DisentangledBias(PositionBias):
    """One layer's ``c2p`` and ``p2c`` terms (unscaled; the attention scales by ``1/√(d · (1 + terms))``)."""

    module_name = "disentangled"
    reads_projections = True
    #: a packed sequence's term comes from :meth:`sequence_terms` (the table projected once per layer)
    per_sequence = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        terms: tuple[Term, ...],
        share_att_key: bool,
        dropout: float,
        relative: bool = True,
        key_bias: bool = True,
    ) -> None:
        super().__init__()
        # without the relative table (relative_attention: false) no term is computed, yet transformers still
        # divides by √(d · (1 + terms))
        self.relative = relative
        self.terms = terms if relative else ()
        self.num_heads = num_heads
        self.score_scale_factor = float(1 + len(terms))  # the configured terms, computed or not
        self.share_att_key = share_att_key
        # only a shared-key term projects its table with the layer's own query and key (a fused Wqkv read in parts,
        # which int8 quantization refuses); with its own projections (DeBERTa v1) it reads none
        self.reads_projections = share_att_key and relative
        self.dropout = nn.Dropout(dropout)  # transformers' pos_dropout, per layer
        if not share_att_key and relative:
            if "c2p" in terms:
                self.pos_key_proj = nn.Linear(hidden_size, hidden_size, bias=key_bias)  # DeBERTa v1's has none
            if "p2c" in terms:
                self.pos_query_proj = nn.Linear(hidden_size, hidden_size)

    def forward(
        self,
        query: torch.Tensor,  # [b, h, q, d]
        key: torch.Tensor,  # [b, h, k, d]
        positions: Positions,
        projections: HeadProjections | None = None,
    ) -> torch.Tensor:
        if not self.terms:
            return query.new_zeros(1, 1, query.shape[2], key.shape[2])
        b, h, q, d = query.shape
        k = key.shape[2]
        pos_key, pos_query, rows = self._tables(positions, projections, h, d)
        index = rows.expand(b, h, q, k)
        score = torch.zeros((), dtype=query.dtype, device=query.device)
        if pos_key is not None:
            c2p = torch.matmul(query, pos_key.transpose(-1, -2))  # [b, h, q, 2s]: query_a · P_k[r]
            score = score + torch.gather(c2p, -1, index)
        if pos_query is not None:
            # key_c · P_q[δ(c, a)]: transformers gathers row -δ(c, a) = δ(a, c) (the buckets are odd in the
            # distance), so the same index serves, read down the columns of P_q · Kᵀ
            p2c = torch.matmul(pos_query, key.transpose(-1, -2))  # [b, h, 2s, k]
            score = score + torch.gather(p2c, -2, index)
        return score

    def sequence_terms(
        self,
        query: torch.Tensor,  # [T, h, d]
        key: torch.Tensor,
        positions: Positions,
        projections: HeadProjections | None = None,
    ) -> SequenceTerms:
        """Each packed sequence's ``c2p + p2c`` (see :meth:`PositionBias.sequence_terms`).

        The table is projected once for the layer, and ``query · P_kᵀ`` / ``P_q · keyᵀ`` are taken over every
        packed token at once (``[h, T, rows]``: two batched products, not one pair per sequence); a run of
        sequences then only gathers its ``[l, l]`` pairs, whose rows are the padded batch's top-left corner (a
        right-padded sequence sits at positions ``0 … l - 1``).
        """
        h, d = query.shape[1:]
        if not self.terms:
            return lambda start, count, length: query.new_zeros(1, 1, length, length)
        pos_key, pos_query, rows = self._tables(positions, projections, h, d)
        # [h, T, rows]: query_a · P_k[r] for every token; [h, rows, T]: P_q[r] · key_c
        c2p = torch.matmul(query.transpose(0, 1), pos_key.transpose(-1, -2)) if pos_key is not None else None
        p2c = torch.matmul(pos_query, key.permute(1, 2, 0)) if pos_query is not None else None

        def term(start: int, count: int, length: int) -> torch.Tensor:
            index = rows[:length, :length].expand(count, h, length, length)
            span = slice(start, start + count * length)
            score = torch.zeros((), dtype=query.dtype, device=query.device)
            if c2p is not None:
                run = c2p[:, span].unflatten(1, (count, length)).transpose(0, 1)  # [n, h, l, rows]
                score = score + torch.gather(run, -1, index)
            if p2c is not None:
                run = p2c[:, :, span].unflatten(2, (count, length)).permute(2, 0, 1, 3)  # [n, h, rows, l]
                score = score + torch.gather(run, -2, index)
            return score

        return term

    def packed_term(
        self,
        query: torch.Tensor,  # [T, h, d]
        key: torch.Tensor,
        positions: Positions,
        projections: HeadProjections | None = None,
    ) -> PackedScoreTerm:
        """c2p as ``rows`` (``query · P_k`` ``[T, h, rows]``), p2c as ``cols`` (``key · P_q``, the same products as
        ``P_q · keyᵀ``, read per key), both gathered through the padded batch's table rows ``[L, L]``."""
        h, d = query.shape[1:]
        if not self.terms:
            return PackedScoreTerm()
        pos_key, pos_query, rows = self._tables(positions, projections, h, d)
        # [h, rows, T] products (the token count, data in a graph, as the last dimension: inductor lowers a batched
        # product with it as the row count by guarding on its value), read as [T, h, rows]
        c2p = torch.matmul(pos_key, query.permute(1, 2, 0)).permute(2, 0, 1) if pos_key is not None else None
        p2c = torch.matmul(pos_query, key.permute(1, 2, 0)).permute(2, 0, 1) if pos_query is not None else None
        return PackedScoreTerm(index=rows, rows=c2p, cols=p2c)

    def _tables(
        self, positions: Positions, projections: HeadProjections | None, h: int, d: int
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The projected table rows the pairs read, ``P_k`` (c2p) and ``P_q`` (p2c) ``[h, rows, d]`` (``None`` for a
        term not computed), and each pair's row ``[q, k]`` into them."""
        table = positions.term(RelativeTable)
        if table is None:
            raise InputError(
                "the disentangled position bias reads the relative table the encoder computes once per pass "
                "(positions.term(RelativeTable)); none was given: build the model with the 'disentangled' scheme"
            )
        if not self.share_att_key and h != self.num_heads:
            raise InputError(
                f"this layer has {h} of its {self.num_heads} heads left after pruning, but its own position "
                "projections (share_att_key: false) cover every head: prune only with share_att_key true"
            )
        span = table.span
        rel = self.dropout(table.embeddings)  # [2s, H]
        # row of the table for each (query, key) pair; cached keys included (relative is [q, k])
        rows = torch.clamp(table.relative + span, 0, 2 * span - 1)
        if rows.device.type == "cpu" and not torch.compiler.is_compiling():
            # Only the rows some pair reads enter the scores (a 128-token batch with 256 log buckets reads 255 of
            # the 512): project and multiply those alone. Eager only: the range is data (a graph keeps the table);
            # CPU only: on an accelerator reading the range would wait for the device in every layer.
            first, last = int(rows.min()), int(rows.max())
            rel, rows = rel[first : last + 1], rows - first
        elif table.contracting and torch.compiler.is_compiling():
            # In a graph the range comes from the shapes instead: the distances (one row of margin each side
            # against the rounding of the log) bound the buckets (RelativeTable.contracting); a 128-token batch
            # then projects 257 of DeBERTa-v3's 512 rows.
            lo, hi = positions.distance_range
            first = torch.sym_max(0, span + lo - 1)
            last = torch.sym_min(2 * span - 1, span + hi + 1)
            rel, rows = rel[first : last + 1], rows - first
        pos_key = self._heads(self._project(rel, "key", projections), h, d) if "c2p" in self.terms else None
        pos_query = self._heads(self._project(rel, "query", projections), h, d) if "p2c" in self.terms else None
        return pos_key, pos_query, rows

    def _project(self, rel: torch.Tensor, which: str, projections: HeadProjections | None) -> torch.Tensor:
        if not self.share_att_key:
            return (self.pos_key_proj if which == "key" else self.pos_query_proj)(rel)
        if projections is None:
            raise InputError("share_att_key: the attention must pass its projections (reads_projections)")
        return projections.project_key(rel) if which == "key" else projections.project_query(rel)

    @staticmethod
    def _heads(x: torch.Tensor, h: int, d: int) -> torch.Tensor:
        return x.view(x.shape[0], h, d).transpose(0, 1)  # [2s, h·d] → [h, 2s, d]


class DisentangledOptions(BaseModel):
    """Options of the ``disentangled`` position scheme (transformers' DebertaV2Config names in brackets)."""

    model_config = ConfigDict(extra="forbid")

    position_buckets: int = Field(256, description="log buckets of relative distance; <= 0: exact distances")
    max_relative_positions: int = Field(-1, description="longest distance bucketed; < 1: max_position_embeddings")
    norm: bool = Field(True, description="LayerNorm on the shared table (norm_rel_ebd: layer_norm)")
    share_att_key: bool = Field(True, description="project the table with the layer's own query/key projections")
    terms: tuple[Term, ...] = Field(("p2c", "c2p"), description="position terms (pos_att_type)")
    relative: bool = Field(
        True,
        description="the relative table and its terms (relative_attention); false: none, while the terms still "
        "widen the softmax denominator, as transformers does",
    )
    absolute: bool = Field(False, description="also add a learned absolute table (position_biased_input)")
    pos_key_bias: bool = Field(
        True,
        description="a bias on the own position-key projection of share_att_key: false (pos_key_proj; DeBERTa v1's "
        "pos_proj has none)",
    )
    mask_padded_queries: bool = Field(
        True,
        description="padded tokens are zeroed and see no key, as transformers' DeBERTa (only padded positions, "
        "and so QA's loss over every position, depend on it)",
    )


class DisentangledPositions(PositionScheme):
    """``disentangled``: DeBERTa-v2/v3's relative positions (see the module docstring)."""

    name = "disentangled"
    adds_score_bias = True

    def __init__(self, max_positions: int, options: DisentangledOptions, model: ModelDims | None) -> None:
        super().__init__(max_positions)
        self.options = options
        self.model = model
        self.max_relative = options.max_relative_positions
        if self.max_relative < 1:
            self.max_relative = max_positions
        self.span = options.position_buckets if options.position_buckets > 0 else self.max_relative
        self.masks_padded_queries = options.mask_padded_queries
        self.relative = options.relative
        # log buckets and clamping give every distance a row: only an absolute table bounds the length
        self.limits_length = options.absolute
        # transformers writes an absolute table it never reads when position_biased_input is false (microsoft/
        # deberta-base has one; its _keys_to_ignore_on_load_unexpected): dropped on load without complaint
        self.ignored_checkpoint_keys = () if options.absolute else ("embeddings.position_embeddings.weight",)

    def embedding(self, hidden_size: int) -> nn.Module | None:
        return nn.Embedding(self.max_positions, hidden_size) if self.options.absolute else None

    def attention_bias(self, num_heads: int, head_dim: int) -> DisentangledBias:
        o = self.options
        # the table dropout is transformers' pos_dropout (hidden_dropout_prob); a scheme not told the sizes has none
        dropout = self.model.hidden_dropout if self.model is not None else 0.0
        return DisentangledBias(
            num_heads * head_dim,
            num_heads,
            o.terms,
            o.share_att_key and self.relative,
            dropout,
            self.relative,
            key_bias=o.pos_key_bias,
        )

    def layer_terms(self, layer_index: int, num_heads: int, head_dim: int) -> LayerPositionTerms:
        return LayerPositionTerms(self.attention_bias(num_heads, head_dim), None)

    def shared_terms(self, model: ModelDims) -> list[SharedPositionTerm]:
        o = self.options
        if not self.relative:
            return []
        return [
            RelativeTableTerm(
                self.span, model.hidden_size, model.layer_norm_eps, o.norm, o.position_buckets, self.max_relative
            )
        ]

    def problems(self, num_heads: int, head_dim: int) -> list[str]:
        if self.model is not None and num_heads * head_dim != self.model.hidden_size and not self.options.share_att_key:
            return ["share_att_key: false needs num_heads · head_dim = hidden_size"]
        if len(set(self.options.terms)) != len(self.options.terms):
            return [f"terms {list(self.options.terms)} repeat a term"]
        return []


def _positions(*, max_positions: int, model: ModelDims, options: DisentangledOptions) -> PositionScheme:
    return DisentangledPositions(max_positions, options, model)


class ContextPoolerOptions(BaseModel):
    """Options of the ``context_pooler`` pooler."""

    model_config = ConfigDict(extra="forbid")

    activation: str = Field("gelu", description="activation after the dense layer (pooler_hidden_act)")

    def model_post_init(self, context: Any) -> None:
        if self.activation not in ACTIVATIONS:
            raise InputError(f"unknown activation {self.activation!r}; choose one of {', '.join(ACTIVATIONS)}")


class ContextPooler(Pooler):
    """DeBERTa's ``ContextPooler``: ``act(dense(hidden[:, 0]))`` (transformers drops the token before the dense
    layer with ``pooler_dropout``, 0 by default; not applied here)."""

    def __init__(self, hidden_size: int, activation: str) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = ACTIVATIONS[activation][0]()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "position",
            "disentangled",
            _positions,
            DisentangledOptions,
            description="DeBERTa's disentangled relative attention: a shared log-bucketed table, c2p and p2c terms",
        ),
        Component(
            "pooler",
            "context_pooler",
            lambda *, hidden_size, options: ContextPooler(hidden_size, options.activation),
            ContextPoolerOptions,
            description="first token → dense → activation (DeBERTa's ContextPooler)",
        ),
    ]
