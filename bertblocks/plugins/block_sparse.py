"""BigBird's block-sparse attention (``attention: {name: block_sparse}``), as transformers' ``BigBirdAttention``
computes it, written on the public plugin API only (``bertblocks.core.*``), as a third party could.

The sequence is cut into blocks of ``block_size`` tokens (padded to a multiple of it first). The first and the
last block are *global*: their queries see every key, and every query sees them. Every other query block sees a
*window* of three blocks (itself and its neighbours) and ``num_random_blocks`` *random* blocks::

    query block 0, nb-1      → every key                                 (global rows)
    query block i (1..nb-2)  → key blocks 0, i-1, i, i+1, nb-1, random   (5 + r blocks; rows 1 and nb-2: 4 + r)

Which blocks are "random" follows transformers exactly: in evaluation it draws nothing and every random slot is
block 0 (so block 0 counts ``1 + r`` times in those rows' softmax); in training it draws them with numpy seeded by
the layer index on every call, as ``BigBirdBlockSparseAttention`` does. A sequence of at most
``(5 + 2·num_random_blocks)·block_size`` tokens runs full attention instead (transformers' fallback), as does a
decoder (causal or cached), cross-attention, and ``attention_type: original_full``.

The sparse path gathers each query block's key blocks (``[b, h, nb-2, (5+r)·bs, d]``) and runs one kernel over
them: memory grows linearly with the length, never ``L × L``. Asked for the attention probabilities (or a head
mask), it computes the same numbers from the equivalent dense ``[b, h, L, L]`` mask instead (a key block counted
``m`` times adds ``log m`` to its scores), through the layer's backend.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt
from torch import nn

from bertblocks.core.cache import KVCache
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Attention, AttentionBackend, Positions, PositionScheme, Rotary
from bertblocks.core.masks import hidden_value, is_hidden
from bertblocks.core.packing import Packing
from bertblocks.errors import BertBlocksError

from .projections import AttentionOutput, QKVProjections


class BlockSparseError(BertBlocksError, ValueError):
    """A block-sparse attention that cannot be built as configured."""


class BlockSparseOptions(BaseModel):
    """Options of the ``block_sparse`` attention (transformers' ``BigBirdConfig`` names)."""

    model_config = ConfigDict(extra="forbid")

    attention_type: Literal["block_sparse", "original_full"] = Field(
        "block_sparse", description="block_sparse: global, window and random blocks; original_full: full attention"
    )
    block_size: PositiveInt = Field(64, description="tokens per block")
    num_random_blocks: NonNegativeInt = Field(3, description="random key blocks per query block")
    bias: bool = Field(True, description="biases on the query, key and value projections (use_bias)")


#: queries per gathered chunk of the sparse kernel: bounds the (5 + r)-fold copies of keys and values
CHUNK_TOKENS = 1024


def full_attention_limit(block_size: int, num_random_blocks: int) -> int:
    """The longest sequence that runs full attention: transformers' ``(5 + 2·r)·block_size`` (two global
    blocks, a window of three, the random blocks and as many again of buffer)."""
    return (5 + 2 * num_random_blocks) * block_size


# ------------------------------------------------------------------------------------------- the random plan
# transformers' numpy code, kept step for step: a seeded RandomState draws the stream np.random.seed(seed) makes.
def _rand_attn_plan(length: int, block_size: int, r: int) -> tuple[list[int], list[int]]:
    if (2 * r + 5) < (length // block_size):
        return [int((2 * r + 5) * block_size), length], [r, 0]
    if (r + 5) < (length // block_size):
        return [int((r + 5) * block_size), length], [r // 2, r - (r // 2)]
    return [length], [r]


def _row_random_blocks(rng: np.random.RandomState, block_id: int, to_start: int, to_end: int, r: int) -> np.ndarray:
    perm = rng.permutation(np.arange(to_start, to_end, dtype=np.int32))
    illegal = [*range(block_id - 1, block_id + 2), 0, to_end - 1]
    if block_id == 1:
        illegal.append(to_end - 2)
    if block_id == to_end - 2:
        illegal.append(1)
    chosen: list[int] = []
    for i in range(to_end - to_start):
        if perm[i] not in illegal:
            chosen.append(perm[i])
        if len(chosen) == r:
            break
    return np.array(chosen, dtype=np.int32)


def _rand_mask_with_head(rng: np.random.RandomState, length: int, bs: int, heads: int, r: int) -> np.ndarray:
    plan_from, plan_r = _rand_attn_plan(length, bs, r)
    nb = length // bs
    plan_blocks = np.array(plan_from) // bs
    last_plan = plan_from.index(length)
    out = [np.zeros((nb, int(np.sum(plan_r[: last_plan + 1]))), dtype=np.int32) for _ in range(heads)]
    for plan_idx in range(last_plan + 1):
        rnd_r_cnt = 0
        if plan_idx > 0:
            if plan_r[plan_idx] > 0:
                rnd_r_cnt = int(np.sum(plan_r[:plan_idx]))
                curr = int(np.sum(plan_r[: plan_idx + 1]))
                for row in range(1, plan_blocks[plan_idx - 1]):
                    for h in range(heads):
                        out[h][row, rnd_r_cnt:curr] = _row_random_blocks(
                            rng, row, plan_blocks[plan_idx - 1], plan_blocks[plan_idx], plan_r[plan_idx]
                        )
            for pl_id in range(plan_idx):
                if plan_r[pl_id] == 0:
                    continue
                for row in range(plan_blocks[plan_idx - 1], plan_blocks[plan_idx]):
                    rnd_r_cnt, to_start = 0, 0
                    if pl_id > 0:
                        rnd_r_cnt = int(np.sum(plan_r[:pl_id]))
                        to_start = plan_blocks[pl_id - 1]
                    curr = int(np.sum(plan_r[: pl_id + 1]))
                    for h in range(heads):
                        out[h][row, rnd_r_cnt:curr] = _row_random_blocks(
                            rng, row, to_start, plan_blocks[pl_id], plan_r[pl_id]
                        )
        if plan_r[plan_idx] == 0:
            continue
        curr = int(np.sum(plan_r[: plan_idx + 1]))
        from_start, to_start = 1, 0
        if plan_idx > 0:
            rnd_r_cnt = int(np.sum(plan_r[:plan_idx]))
            from_start = to_start = plan_blocks[plan_idx - 1]
        for row in range(from_start, plan_blocks[plan_idx]):
            for h in range(heads):
                out[h][row, rnd_r_cnt:curr] = _row_random_blocks(
                    rng, row, to_start, plan_blocks[plan_idx], plan_r[plan_idx]
                )
    return np.stack([o[1 : nb - 1] for o in out])


def _rand_mask_paper(rng: np.random.RandomState, max_length: int, bs: int, r: int, last_idx: int) -> np.ndarray:
    """transformers' ``_bigbird_block_rand_mask`` (the paper's plans, for lengths 1024, 3072 and 4096), its
    off-by-one windows of the last two rows included."""
    nb = max_length // bs
    rand_attn = np.zeros((nb - 2, r), dtype=np.int32)
    middle = np.arange(1, nb - 1, dtype=np.int32)
    last = nb - 1
    if last_idx > (2 * bs):
        last = (last_idx // bs) - 1
    for i in range(1, nb - 1):
        start, end = i - 2, i
        if i == 1:
            rand_attn[i - 1, :] = rng.permutation(middle[2:last])[:r]
        elif i == 2:
            rand_attn[i - 1, :] = rng.permutation(middle[3:last])[:r]
        elif i in (nb - 3, nb - 2) or start > last:
            rand_attn[i - 1, :] = rng.permutation(middle[:last])[:r]
        elif (end + 1) == last:
            rand_attn[i - 1, :] = rng.permutation(middle[:start])[:r]
        else:
            rand_attn[i - 1, :] = rng.permutation(np.concatenate((middle[:start], middle[end + 1 : last])))[:r]
    return rand_attn


def random_blocks(
    length: int, block_size: int, heads: int, r: int, *, training: bool, seed: int, max_positions: int
) -> torch.Tensor:
    """The random key blocks of query blocks ``1 .. nb-2``: ``[heads, nb-2, r]`` int64, as transformers draws
    them (all zero in evaluation; numpy seeded with ``seed``, the layer index, in training)."""
    nb = length // block_size
    if not training:
        return torch.zeros(heads, nb - 2, r, dtype=torch.long)
    rng = np.random.RandomState(seed)
    if length in (1024, 3072, 4096):  # transformers keeps the paper's plans for these lengths
        rows = [_rand_mask_paper(rng, max_positions, block_size, r, last_idx=1024)[: nb - 2] for _ in range(heads)]
        return torch.from_numpy(np.stack(rows)).long()
    return torch.from_numpy(_rand_mask_with_head(rng, length, block_size, heads, r)).long()


def key_blocks(nb: int, rand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For query blocks ``1 .. nb-2``: the key blocks each sees (``[h, nb-2, 5+r]``: first, window of three,
    last, random) and which slots count (``[nb-2, 5+r]`` bool: rows 1 and nb-2 have 4 + r, their window's
    outer block being the global one already listed)."""
    h, rows, r = rand.shape
    i = torch.arange(1, nb - 1)[:, None]  # [nb-2, 1]
    fixed = torch.cat([torch.zeros_like(i), i - 1, i, i + 1, torch.full_like(i, nb - 1)], 1)  # [nb-2, 5]
    valid = torch.ones(rows, 5 + r, dtype=torch.bool)
    valid[0, 1] = False  # row 1: its left neighbour is block 0
    valid[-1, 3] = False  # row nb-2: its right neighbour is block nb-1
    return torch.cat([fixed.expand(h, rows, 5), rand], -1), valid


def block_sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor,
    blocks: torch.Tensor,
    valid: torch.Tensor,
    block_size: int,
    scale: float,
    backend: AttentionBackend | None = None,
) -> torch.Tensor:
    """The gathered kernel.

    Shapes::

        query, key, value [b, h, L, d] (L = nb·bs); key_mask [b, L] additive; blocks [h, nb-2, 5+r];
        valid [nb-2, 5+r] → context [b, h, L, d]

    ``backend`` computes the two global query blocks over every key (a call of the mask contract:
    ``[b, 1, 1, L]``); ``None``: SDPA. The other blocks always run through SDPA on the gathered keys.
    """
    b, h, length, d = query.shape
    bs, nb = block_size, length // block_size
    slots = blocks.shape[-1]
    low = hidden_value(query.dtype)
    qb = query.view(b, h, nb, bs, d)
    # global query blocks: every key
    ends = torch.cat([qb[:, :, 0], qb[:, :, -1]], 2)  # [b, h, 2·bs, d]
    if backend is None:
        ends = F.scaled_dot_product_attention(ends, key, value, attn_mask=key_mask[:, None, None, :], scale=scale)
    else:
        mask = key_mask[:, None, None, :]
        ends = backend(ends, key, value, mask=mask, scale=scale, dropout_p=0.0, is_causal=False, need_weights=False)[0]
    # the others: their 5 + r key blocks, gathered, CHUNK_TOKENS queries at a time, so that the gathered copies
    # ((5 + r)× the keys and values) stay bounded however long the sequence
    heads = torch.arange(h, device=query.device)[:, None]  # [h, 1]
    blocks, valid = blocks.to(query.device), valid.to(query.device)
    kb_all, vb_all = key.view(b, h, nb, bs, d), value.view(b, h, nb, bs, d)
    blocked_mask = key_mask.view(b, nb, bs)
    step = max(1, CHUNK_TOKENS // bs)
    parts = [ends[:, :, :bs]]
    for first in range(0, nb - 2, step):
        rows = min(step, nb - 2 - first)
        flat = blocks[:, first : first + rows].reshape(h, -1)  # [h, rows·(5+r)]
        kb = kb_all[:, heads, flat].view(b, h * rows, slots * bs, d)
        vb = vb_all[:, heads, flat].view(b, h * rows, slots * bs, d)
        mask = blocked_mask[:, flat].view(b, h, rows, slots, bs)  # additive, per key
        mask = mask.masked_fill(~valid[first : first + rows, :, None], low).view(b, h * rows, 1, slots * bs)
        middle = qb[:, :, 1 + first : 1 + first + rows].reshape(b, h * rows, bs, d)
        middle = F.scaled_dot_product_attention(middle, kb, vb, attn_mask=mask, scale=scale)  # [b, h·rows, bs, d]
        # reshape: a CUDA kernel may return the output strided (heads and rows not adjacent), seen on an H100
        parts.append(middle.reshape(b, h, rows * bs, d))
    parts.append(ends[:, :, bs:])
    out = torch.cat(parts, 2)
    return out  # [b, h, L, d]


def dense_block_mask(
    key_mask: torch.Tensor, blocks: torch.Tensor, valid: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The same attention as a dense additive mask ``[b, h, L, L]``: ``log m`` where a key block is seen ``m``
    times by a query block, hidden (:func:`~bertblocks.core.masks.hidden_value`) where it is not seen or the key is
    padding."""
    length = key_mask.shape[1]
    h = blocks.shape[0]
    nb = length // block_size
    counts = torch.zeros(h, nb, nb, device=key_mask.device, dtype=key_mask.dtype)
    counts[:, 0] = counts[:, -1] = 1
    ones = valid.to(counts.dtype).to(key_mask.device).expand(h, *valid.shape)
    counts[:, 1:-1].scatter_add_(2, blocks.to(key_mask.device), ones)
    counts = counts.repeat_interleave(block_size, 1).repeat_interleave(block_size, 2)  # [h, L, L]
    low = hidden_value(key_mask.dtype)
    seen = counts.log().to(key_mask.dtype).masked_fill(counts == 0, low)[None]  # [1, h, L, L]
    hidden = is_hidden(key_mask[:, None, None, :])
    return seen.masked_fill(hidden, low) + key_mask[:, None, None, :].masked_fill(hidden, 0)


class _Projections(QKVProjections):
    """HF's ``attention.self``: ``query``, ``key``, ``value``, and the position scheme's ``rotary`` (if any)."""

    def __init__(self, hidden_size: int, inner: int, bias: bool, rotary: Rotary | None) -> None:
        super().__init__(hidden_size, inner, bias)
        if rotary is not None:
            self.rotary = rotary
        self.has_rotary = rotary is not None


class BlockSparseAttention(Attention):
    """BigBird's attention sub-layer: block-sparse past :func:`full_attention_limit` tokens, full below it.

    Shapes::

        hidden [b, q, H] → Q, K, V [b, h, q, d] → pad to L = nb·bs → block-sparse kernel [b, h, L, d]
        → [b, q, h·d] → output [b, q, H]

    Args:
        hidden_size, num_heads, dropout, hidden_dropout: as every attention (dropout acts on the full path only:
            transformers' block-sparse path drops nothing).
        backend: the kernel of the full path (and of the dense path that returns probabilities).
        rotary: the position scheme's rotation, or ``None``.
        norm: the post-LN norm (``output.LayerNorm``), or ``None``.
        options: :class:`BlockSparseOptions`.
        layer_index: seeds the random blocks in training, as transformers seeds them.
        max_positions: ``max_position_embeddings`` (transformers' paper plans draw over it).
    """

    def __init__(
        self,
        *,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        hidden_dropout: float,
        backend: AttentionBackend,
        rotary: Rotary | None,
        norm: nn.Module | None,
        options: BlockSparseOptions,
        layer_index: int,
        max_positions: int,
    ) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise BlockSparseError(f"num_heads {num_heads} must divide hidden_size {hidden_size}")
        self.num_heads = self.original_num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.scale = self.head_dim**-0.5
        self.dropout_p = dropout
        self.backend = backend
        self.sparse = options.attention_type == "block_sparse"
        self.block_size = options.block_size
        self.num_random_blocks = options.num_random_blocks
        self.limit = full_attention_limit(options.block_size, options.num_random_blocks)
        self.seed = layer_index
        self.max_positions = max_positions
        # Past the full-attention limit the block layout is counted over the padded length (the last block, global,
        # is the batch's last): the padding a batch carries changes real tokens' outputs, as in transformers. Up to
        # it the attention is full and masked, as BERT's: `packing: auto` packs those batches (capabilities.py).
        self.reads_padded_positions_above: int | None = self.limit if self.sparse else None
        self.self = _Projections(hidden_size, hidden_size, options.bias, rotary)
        self.output = AttentionOutput(hidden_size, hidden_size, 0.0, hidden_dropout, norm)  # norm: built, or None
        self.kept_heads: list[int] = list(range(num_heads))
        self._plans: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------------------------------------------ forward
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
        proj = self.self
        if encoder_hidden_states is not None:
            query = self._heads(proj.query(hidden_states))
            cached = cache.cross(layer_index) if cache is not None else None
            if cached is None:
                cached = (self._heads(proj.key(encoder_hidden_states)), self._heads(proj.value(encoder_hidden_states)))
                if cache is not None:
                    cache.set_cross(layer_index, *cached)
            key, value = cached
        else:
            query, key, value = self._project(hidden_states, positions.tokens() if proj.has_rotary else None, positions)
            if cache is not None:
                key, value = cache.update(layer_index, key, value)
        sparse = (
            self.sparse
            and encoder_hidden_states is None
            and cache is None
            and not is_causal
            and q > self.limit
            and (mask is None or (mask.shape[1] == 1 and mask.shape[2] == 1))
        )
        if sparse:
            context, weights = self._sparse(query, key, value, mask, head_mask, output_attentions)
        else:
            context, weights = self._full(query, key, value, mask, head_mask, output_attentions, is_causal)
        context = context.transpose(1, 2).reshape(b, q, -1)
        return self.output(context, hidden_states), weights

    def _project(
        self, hidden_states: torch.Tensor, ids: torch.Tensor | None, positions: Positions
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = hidden_states.shape
        h, d = self.num_heads, self.head_dim
        proj = self.self
        query, key, value = (m(hidden_states).view(b, t, h, d) for m in (proj.query, proj.key, proj.value))
        if proj.has_rotary:
            query, key = proj.rotary(query, key, ids, positions.memo)
            if proj.rotary.rotates_value:
                value = proj.rotary.rotate_value(value, ids, positions.memo)
        return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [b, h, t, d]

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def _full(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        is_causal: bool,
        kernel: AttentionBackend | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        context, weights = (kernel or self.backend)(
            query,
            key,
            value,
            mask=mask,
            scale=self.scale,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=is_causal and query.shape[2] > 1,
            need_weights=output_attentions,
        )
        return self._head_mask(context, weights, head_mask)

    def _head_mask(
        self, context: torch.Tensor, weights: torch.Tensor | None, head_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if head_mask is None:
            return context, weights
        # scaling a head's probabilities scales its output alike
        factor = head_mask[self.kept_heads].view(1, self.num_heads, 1, 1).to(context.dtype)
        return context * factor, (weights * factor if weights is not None else None)

    def _sparse(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        kernel: AttentionBackend | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        kernel = kernel or self.backend
        b, _, q, _ = query.shape
        bs = self.block_size
        pad = (bs - q % bs) % bs
        low = hidden_value(query.dtype)
        key_mask = query.new_zeros(b, q) if mask is None else mask[:, 0, 0, :].to(query.dtype).expand(b, q)
        if pad:
            # transformers pads the input to a multiple of block_size; the padding is hidden as keys and dropped
            query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
            key_mask = F.pad(key_mask, (0, pad), value=low)
        length = q + pad
        blocks, valid = key_blocks(length // bs, self._random_blocks(length))
        if output_attentions or head_mask is not None:
            dense = dense_block_mask(key_mask, blocks, valid, bs)
            context, weights = kernel(
                query, key, value, mask=dense, scale=self.scale, dropout_p=0.0, is_causal=False, need_weights=True
            )
            context, weights = self._head_mask(context, weights, head_mask)
            weights = weights[:, :, :q, :q] if weights is not None and output_attentions else None
        else:
            context = block_sparse_attention(query, key, value, key_mask, blocks, valid, bs, self.scale, kernel)
            weights = None
        # transformers zeroes the context of padded queries
        context = context * (~is_hidden(key_mask)).to(context.dtype)[:, None, :, None]
        return context[:, :, :q], weights

    def _random_blocks(self, length: int) -> torch.Tensor:
        """``[h, nb-2, r]`` for the heads still here (numbered as built)."""
        nb = length // self.block_size
        if not self.training:
            return torch.zeros(self.num_heads, nb - 2, self.num_random_blocks, dtype=torch.long)
        plan = self._plans.get(length)
        if plan is None:  # the same every call: transformers reseeds with the layer index each time
            plan = random_blocks(
                length,
                self.block_size,
                self.original_num_heads,
                self.num_random_blocks,
                training=True,
                seed=self.seed,
                max_positions=self.max_positions,
            )
            self._plans[length] = plan
        return plan[self.kept_heads]

    def _packed(
        self,
        hidden_states: torch.Tensor,  # [1, T, H]
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        packing: Packing,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A packed batch. Padded to at most the full-attention limit (what ``packing: auto`` packs): full attention
        within each sequence, as the padded batch attends; projections on the real tokens, the attention varlen
        where the backend takes it, else re-padded for the call. Longer (``packing: always``): each sequence attends
        as it would alone, with its own block layout when it is long enough to be sparse."""
        ids = positions.tokens(packed=True) if self.self.has_rotary else None
        if not self.sparse or packing.length <= self.limit:
            return self._packed_full(hidden_states, mask, ids, positions, head_mask, output_attentions, packing)
        query, key, value = self._project(hidden_states, ids, positions)  # [1, h, T, d]
        bounds = packing.cu_seqlens.tolist()
        contexts, weights = [], None
        if output_attentions:
            weights = query.new_zeros(packing.batch, self.num_heads, packing.length, packing.length)
        for i, (start, end) in enumerate(itertools.pairwise(bounds)):
            q, k, v = (x[:, :, start:end] for x in (query, key, value))
            # one sequence alone is no call of the (padded or varlen) mask contract: plain softmax attention
            if end - start > self.limit:
                context, w = self._sparse(q, k, v, None, head_mask, output_attentions, _plain_attention)
            else:
                context, w = self._full(q, k, v, None, head_mask, output_attentions, False, _plain_attention)
            contexts.append(context)
            if weights is not None and w is not None:
                weights[i, :, : end - start, : end - start] = w[0]
        context = torch.cat(contexts, 2).transpose(1, 2).reshape(1, hidden_states.shape[1], -1)
        return self.output(context, hidden_states), weights

    def _packed_full(
        self,
        hidden_states: torch.Tensor,  # [1, T, H]
        mask: torch.Tensor | None,
        ids: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        packing: Packing,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Full attention on a packed batch: ``[1, T, H]`` in and out, as BERT's attention packs."""
        t = hidden_states.shape[1]
        query, key, value = self._project(hidden_states, ids, positions)  # [1, h, T, d]
        dropout_p = self.dropout_p if self.training else 0.0
        if self.backend.accepts_varlen(dropout_p=dropout_p) and head_mask is None and not output_attentions:
            q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, h, d]
            context = self.backend.varlen(
                q,
                k,
                v,
                cu_seqlens=packing.cu_seqlens,
                max_seqlen=packing.max_seqlen,
                scale=self.scale,
                dropout_p=dropout_p,
            )  # [T, h, d]
            return self.output(context.reshape(1, t, -1), hidden_states), None
        # re-padded for this call: [T, h·d] → [b, h, L, d]; padded keys hidden by the mask, padded queries dropped
        query, key, value = (
            self._heads(packing.unpack(x[0].transpose(0, 1).reshape(t, -1))) for x in (query, key, value)
        )
        context, weights = self._full(query, key, value, mask, head_mask, output_attentions, False)
        b, _, length, _ = context.shape
        context = packing.pack(context.transpose(1, 2).reshape(b, length, -1))  # [T, h·d]
        return self.output(context[None], hidden_states), weights

    def prune_heads(self, heads: set[int]) -> None:
        drop = {head for head in heads if head in self.kept_heads}
        if not drop:
            return
        keep_now = [i for i, head in enumerate(self.kept_heads) if head not in drop]
        if not keep_now:
            raise BlockSparseError("cannot prune every head of a layer")
        d = self.head_dim
        index = torch.cat([torch.arange(i * d, (i + 1) * d) for i in keep_now]).to(self.output.dense.weight.device)
        for name in ("query", "key", "value"):
            setattr(self.self, name, _select(getattr(self.self, name), index, 0))
        self.output.dense = _select(self.output.dense, index, 1)
        self.kept_heads = [self.kept_heads[i] for i in keep_now]
        self.num_heads = len(self.kept_heads)


def _plain_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    is_causal: bool,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax attention called as a backend is: SDPA, or an explicit softmax when the weights are asked for."""
    if not need_weights:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        return out, None
    scores = query @ key.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + mask
    weights = F.dropout(scores.softmax(-1), dropout_p)
    return weights @ value, weights


def _select(layer: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A copy of ``layer`` keeping ``index`` along ``dim`` of its weight (0: outputs, 1: inputs)."""
    weight = layer.weight.detach().index_select(dim, index)
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=layer.bias is not None, device=weight.device)
    new = new.to(weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if layer.bias is not None:
            new.bias.copy_(layer.bias if dim == 1 else layer.bias.index_select(0, index))
    return new


def build_block_sparse(
    *,
    hidden_size: int,
    num_heads: int,
    dropout: float,
    hidden_dropout: float,
    backend: AttentionBackend,
    position: PositionScheme,
    layer_index: int,
    norm: Callable[[], nn.Module] | None,
    options: BlockSparseOptions,
    **_: Any,
) -> BlockSparseAttention:
    terms = position.layer_terms(layer_index, num_heads, hidden_size // num_heads)
    if terms.bias is not None:
        raise BlockSparseError(
            f"attention block_sparse takes no position score bias (position {type(position).__name__} adds one): "
            "the sparse kernel sees blocks, not distances; use an absolute or rotary position scheme"
        )
    return BlockSparseAttention(
        hidden_size=hidden_size,
        num_heads=num_heads,
        dropout=dropout,
        hidden_dropout=hidden_dropout,
        backend=backend,
        rotary=terms.rotary,
        norm=norm() if norm is not None else None,
        options=options,
        layer_index=layer_index,
        max_positions=position.max_positions,
    )


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "attention",
            "block_sparse",
            build_block_sparse,
            BlockSparseOptions,
            description="BigBird's block-sparse attention: global, sliding-window and random blocks",
        )
    ]


__all__ = [
    "BlockSparseAttention",
    "BlockSparseOptions",
    "block_sparse_attention",
    "dense_block_mask",
    "full_attention_limit",
    "key_blocks",
    "random_blocks",
]
