"""Longformer's attention (kind ``attention``, name ``longformer``): a sliding window plus global tokens.

Written against the public plugin API only (``bertblocks.core``, ``bertblocks.config``, ``bertblocks.errors``), as a
third party would write it; any family can select it in YAML::

    encoder:
      attention: {name: longformer, attention_window: 512}   # per layer: encoder.overrides

What it computes (transformers' ``LongformerSelfAttention``, on the same weights):

* every token attends to the keys at most ``w = attention_window / 2`` positions before or after it (real keys
  only), plus every *global* token of its row;
* a global token (``global_attention_mask`` = 1 at a real position) attends to every real key of its row through
  separate projections (``query_global``, ``key_global``, ``value_global``), and its output replaces the windowed
  one.

The window is computed in blocks of ``w`` queries against the ``3w`` keys around them (plus the ``G`` global keys),
each block one call of PyTorch's fused ``scaled_dot_product_attention`` with a ``[w, 3w + G]`` mask: work and memory
linear in the length, never an ``L×L`` score matrix or mask. ``output_attentions`` computes the same band with the
probabilities written out (and lays them out as ``[b, h, L, L]``, quadratic, only then).
transformers pads the sequence to a multiple of the window first; the blocks need no such padding of the inputs
(the padded positions it adds are masked keys, invisible to every real token), so real tokens get its numbers for
any length. A padded query attends to nothing, as in transformers (its row of probabilities is zero), so padded
positions get transformers' numbers too.

The kernel is the module's own: the ``backend`` the builder passes is not used (the window and the global columns
do not fit the backend contract's ``[b, h, q, k]`` mask without the quadratic mask this avoids).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator
from torch import nn

from bertblocks.config import BertConfig
from bertblocks.core.capabilities import AttentionCapabilities
from bertblocks.core.component import Component
from bertblocks.core.interfaces import ExtraInput, Positions, PositionScheme
from bertblocks.core.masks import hidden_value, is_hidden
from bertblocks.core.packing import Packing
from bertblocks.errors import BertBlocksError, InputError, UnsupportedError

from .projections import AttentionOutput, EncoderOnlyAttention, QKVProjections, qkv_linears

#: the forward input the attention reads beyond the standard ones: ``[b, q]`` (or ``[b, c, q]``), 1 = global
GLOBAL_ATTENTION_MASK = "global_attention_mask"
#: the global projections' parameters (``query_global.weight``, …) end with one of these
_GLOBAL = ("_global.weight", "_global.bias")


class LongformerAttentionError(BertBlocksError, ValueError):
    """A Longformer attention asked for what it cannot be: an odd window, a position term it has no place for."""


class LongformerOptions(BaseModel):
    """Options of the ``longformer`` attention."""

    model_config = ConfigDict(extra="forbid")

    attention_window: PositiveInt = Field(
        512, description="keys a token sees around it, both sides together (even: w = attention_window / 2 per side)"
    )

    @field_validator("attention_window")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise LongformerAttentionError(
                f"must be even (transformers' attention_window; half on each side), not {value}"
            )
        return value


class GlobalProjections(QKVProjections):
    """transformers' ``LongformerSelfAttention`` parameters: the windowed projections ``query``, ``key``, ``value``
    and the global ones ``query_global``, ``key_global``, ``value_global`` (HF's names, so checkpoints load)."""

    def __init__(self, hidden_size: int, all_head_size: int) -> None:
        super().__init__(hidden_size, all_head_size)
        self.query_global, self.key_global, self.value_global = qkv_linears(hidden_size, all_head_size)


class LongformerAttention(EncoderOnlyAttention):
    """Sliding-window attention with global tokens, as transformers' Longformer.

    Shapes (``w`` one-sided window, ``n = ⌈L / w⌉`` blocks, ``G`` the most global tokens of any row)::

        hidden [b, L, H] → Q, K, V [b, h, L, d]
        Q blocks [b, h, n, w, d] against K, V windows [b, h, n, 3w, d] and K, V at global tokens [b, h, G, d]
        → fused attention per block, mask [b, n, w, G + 3w] → context [b, h, L, d]
        global tokens: Q_global [b, h, G, d] · K_global [b, h, L, d] → softmax → · V_global → their rows of context
        context [b, L, h·d] → output dense → dropout → + residual → norm
    """

    kind = "longformer"
    extra_inputs: ClassVar[tuple[str, ...]] = (GLOBAL_ATTENTION_MASK,)
    capabilities = AttentionCapabilities(
        pruning=False,
        cache=False,
        reason="Longformer's attention is an encoder's (no KV cache), and its global projections are not pruned",
    )

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        hidden_dropout: float,
        attention_window: int,
        norm: nn.Module | None,
    ) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise InputError(f"num_heads {num_heads} must divide hidden_size {hidden_size}")
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.one_sided = attention_window // 2
        self.sequence_multiple = self.one_sided  # an exported graph takes whole blocks of w queries
        self.dropout_p = dropout
        self.self = GlobalProjections(hidden_size, hidden_size)  # `self`: HF's child name
        self.output = AttentionOutput(hidden_size, hidden_size, 0.0, hidden_dropout, norm)  # norm: built, or None

    def extra_input_specs(self) -> tuple[ExtraInput, ...]:
        """``global_attention_mask``: ``[batch, sequence]``, 1 at global tokens (the example: each row's first, as
        transformers' classifier chooses)."""

        def first_global(batch: int, length: int) -> torch.Tensor:
            mask = torch.zeros(batch, length, dtype=torch.long)
            mask[:, 0] = 1
            return mask

        return (ExtraInput(GLOBAL_ATTENTION_MASK, ("batch", "sequence"), torch.long, first_global),)

    def attend(
        self,
        hidden_states: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        packing: Packing | None,
        global_attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if packing is not None:
            # the window is positional: run the padded layout (packed tokens keep their order, padding is masked,
            # so real tokens get the padded run's numbers) and pack the result again
            padded, weights = self._attend(
                packing.unpack(hidden_states[0]), mask, head_mask, output_attentions, global_attention_mask
            )
            return packing.pack(padded)[None], weights
        return self._attend(hidden_states, mask, head_mask, output_attentions, global_attention_mask)

    def _attend(
        self,
        hidden: torch.Tensor,  # [b, L, H]
        mask: torch.Tensor | None,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        global_attention_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, length, _ = hidden.shape
        h, d, w = self.num_heads, self.head_dim, self.one_sided
        proj = self.self
        padded = _padded_keys(mask, b, length, hidden.device)  # [b, L] True at padding
        is_global = None
        if global_attention_mask is not None:
            # a padded position is never global (transformers multiplies the two masks)
            is_global = global_attention_mask.reshape(b, length).bool() & ~padded
        # transformers divides the queries (not the scores) by √d
        query = self._heads(proj.query(hidden) / d**0.5)  # [b, h, L, d]
        key, value = self._heads(proj.key(hidden)), self._heads(proj.value(hidden))

        n = -(-length // w)  # blocks of w queries
        extra = n * w - length
        q_blocks = F.pad(query, (0, 0, 0, extra)).reshape(b, h, n, w, d)
        k_windows = F.pad(key, (0, 0, w, extra + w)).unfold(2, 3 * w, w)  # [b, h, n, d, 3w]
        v_windows = F.pad(value, (0, 0, w, extra + w)).unfold(2, 3 * w, w)
        # query r of block i sees key i·w - w + s when that key is real, inside the sequence, not global (global
        # keys have their own columns) and at most w positions away: s - r in [0, 2w]
        local_keys = ~padded if is_global is None else ~(padded | is_global)
        visible = F.pad(local_keys, (w, extra + w), value=False).unfold(1, 3 * w, w)  # [b, n, 3w]
        offset = torch.arange(3 * w, device=hidden.device)[None, :] - torch.arange(w, device=hidden.device)[:, None]
        allowed = visible[:, :, None, :] & ((offset >= 0) & (offset <= 2 * w))  # [b, n, w, 3w]
        # a padded query attends to nothing (transformers zeroes its row): its output is the projection's bias
        # plus the residual, as transformers' is, which question answering's softmax over every position reads
        quiet = F.pad(padded, (0, extra), value=True).reshape(b, n, w, 1)
        glob = _GlobalTokens.of(is_global) if is_global is not None else None
        k_global = _gather(key, glob.index) if glob is not None else None  # [b, h, G, d]: windowed projections
        v_global = _gather(value, glob.index) if glob is not None else None
        dropout_p = self.dropout_p if self.training else 0.0
        if output_attentions:
            context, probs, g_probs = self._explicit(
                q_blocks, k_windows, v_windows, allowed, quiet, glob, k_global, v_global, dropout_p
            )
            weights = self._dense_weights(probs, g_probs, glob, length)
        else:
            context, weights = (
                self._fused(q_blocks, k_windows, v_windows, allowed, quiet, glob, k_global, v_global, dropout_p),
                None,
            )
        context = context.reshape(b, h, n * w, d)[:, :, :length]

        if glob is not None:
            g_context, g_weights = self._global_rows(hidden, padded, glob)  # [b, h, G, d], [b, h, G, L]
            context = _scatter_rows(context, glob, g_context)
            if weights is not None:
                weights = _scatter_rows(weights, glob, g_weights)
        elif torch.is_grad_enabled():
            # a batch without global tokens leaves the global projections out of the graph, and DDP stops on a
            # parameter without a gradient (transformers' Longformer needs find_unused_parameters): they join the
            # graph with a zero term, exactly zero, so the numbers are those of the window alone
            unused = sum(p.sum() for name, p in proj.named_parameters() if name.endswith(_GLOBAL))
            context = context + 0.0 * unused
        if head_mask is not None:  # scales each head's probabilities, hence its output
            factor = head_mask.view(1, h, 1, 1)
            context = context * factor
            weights = weights * factor if weights is not None else None
        context = context.transpose(1, 2).reshape(b, length, h * d)
        return self.output(context, hidden), weights

    def _fused(
        self,
        q_blocks: torch.Tensor,  # [b, h, n, w, d]
        k_windows: torch.Tensor,  # [b, h, n, d, 3w]
        v_windows: torch.Tensor,
        allowed: torch.Tensor,  # [b, n, w, 3w] bool
        quiet: torch.Tensor,  # [b, n, w, 1] bool: padded queries
        glob: _GlobalTokens | None,
        k_global: torch.Tensor | None,  # [b, h, G, d]
        v_global: torch.Tensor | None,
        dropout_p: float,
    ) -> torch.Tensor:
        """The window (and global keys) through PyTorch's fused attention, one block of ``w`` queries against its
        ``3w`` (+ ``G``) keys per batch entry: no probabilities are materialised. ``[b, h, n, w, d]``."""
        b, h, n, w, d = q_blocks.shape
        # blocks become the batch ([b·n, h, ·, d]) so that one [b·n, 1, w, K] mask serves every head
        query = q_blocks.transpose(1, 2).reshape(b * n, h, w, d)
        key = k_windows.permute(0, 2, 1, 4, 3)  # [b, n, h, 3w, d]
        value = v_windows.permute(0, 2, 1, 4, 3)
        if glob is not None and k_global is not None and v_global is not None:
            key = torch.cat([k_global[:, None].expand(b, n, h, glob.count, d), key], dim=3)
            value = torch.cat([v_global[:, None].expand(b, n, h, glob.count, d), value], dim=3)
            allowed = torch.cat([glob.valid[:, None, None, :].expand(b, n, w, glob.count), allowed], dim=-1)
        keys = key.shape[3]
        # additive and finite (a padded query's row may hide every key; its output is zeroed below)
        mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        mask = mask.masked_fill(~allowed, hidden_value(query.dtype)).reshape(b * n, 1, w, keys)
        context = F.scaled_dot_product_attention(
            query,
            key.reshape(b * n, h, keys, d),
            value.reshape(b * n, h, keys, d),
            attn_mask=mask,
            dropout_p=dropout_p,
            scale=1.0,  # the queries are already divided by √d
        )  # [b·n, h, w, d]
        context = context.reshape(b, n, h, w, d).masked_fill(quiet[:, :, None], 0.0)
        return context.transpose(1, 2)  # [b, h, n, w, d]

    def _explicit(
        self,
        q_blocks: torch.Tensor,
        k_windows: torch.Tensor,
        v_windows: torch.Tensor,
        allowed: torch.Tensor,
        quiet: torch.Tensor,
        glob: _GlobalTokens | None,
        k_global: torch.Tensor | None,
        v_global: torch.Tensor | None,
        dropout_p: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The same with the probabilities written out (for ``output_attentions``): context ``[b, h, n, w, d]``,
        band probabilities ``[b, h, n, w, 3w]`` and global-key ones ``[b, h, n, w, G]`` (or ``None``)."""
        w = q_blocks.shape[3]
        low = hidden_value(q_blocks.dtype)
        scores = (q_blocks @ k_windows).masked_fill(~allowed[:, None], low)  # [b, h, n, w, 3w]
        if glob is not None and k_global is not None:
            g_scores = q_blocks @ k_global[:, :, None].transpose(-1, -2)  # [b, h, n, w, G]
            g_scores = g_scores.masked_fill(~glob.valid[:, None, None, None, :], low)
            scores = torch.cat([g_scores, scores], dim=-1)  # [b, h, n, w, G + 3w]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q_blocks.dtype)
        probs = F.dropout(probs.masked_fill(quiet[:, None], 0.0), p=dropout_p, training=dropout_p > 0)
        if glob is not None and v_global is not None:
            g_probs, probs = probs.split([glob.count, 3 * w], dim=-1)
            context = probs @ v_windows.transpose(-1, -2) + g_probs @ v_global[:, :, None]
            return context, probs, g_probs
        return probs @ v_windows.transpose(-1, -2), probs, None

    def _global_rows(
        self, hidden: torch.Tensor, padded: torch.Tensor, glob: _GlobalTokens
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The global tokens' own attention: their ``query_global`` rows over every real key's ``key_global`` and
        ``value_global``: context ``[b, h, G, d]`` and probabilities ``[b, h, G, L]``."""
        proj = self.self
        d = self.head_dim
        at_global = hidden.gather(1, glob.index[:, :, None].expand(-1, -1, hidden.shape[-1]))  # [b, G, H]
        query = self._heads(proj.query_global(at_global) / d**0.5)  # [b, h, G, d]
        key, value = self._heads(proj.key_global(hidden)), self._heads(proj.value_global(hidden))
        scores = (query @ key.transpose(-1, -2)).masked_fill(padded[:, None, None, :], hidden_value(query.dtype))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        probs = F.dropout(probs, p=self.dropout_p, training=self.training)
        return probs @ value, probs

    def _dense_weights(
        self, probs: torch.Tensor, g_probs: torch.Tensor | None, glob: _GlobalTokens | None, length: int
    ) -> torch.Tensor:
        """The band (and global-key) probabilities laid out as ``[b, h, L, L]``, what ``output_attentions``
        returns (quadratic: built only when asked)."""
        b, h, n, w, _ = probs.shape
        device = probs.device
        columns = torch.arange(n, device=device)[:, None] * w + torch.arange(3 * w, device=device)  # [n, 3w]
        dense = probs.new_zeros(b, h, n, w, n * w + 2 * w)  # key columns shifted by w (the left padding)
        dense.scatter_(-1, columns[None, None, :, None, :].expand_as(probs), probs)
        dense = dense.reshape(b, h, n * w, -1)[:, :, :length, w : w + length]
        if g_probs is not None and glob is not None:
            g = g_probs.reshape(b, h, n * w, -1)[:, :, :length] * glob.valid[:, None, None, :]
            dense = dense.scatter_add(-1, glob.index[:, None, None, :].expand(-1, h, length, -1), g)
        return dense

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, t, h·d]`` → ``[b, h, t, d]``."""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def prune_heads(self, heads: set[int]) -> None:
        raise UnsupportedError("the longformer attention cannot be pruned (declared: capabilities.pruning is False)")


class _GlobalTokens:
    """Where each row's global tokens are: ``index [b, G]`` (positions, in order; slots past a row's count repeat
    position 0), ``valid [b, G]`` (which slots hold a global token) and ``G`` (the most global tokens of any row)."""

    def __init__(self, index: torch.Tensor, valid: torch.Tensor) -> None:
        self.index, self.valid, self.count = index, valid, index.shape[1]

    @classmethod
    def of(cls, is_global: torch.Tensor) -> _GlobalTokens | None:
        counts = is_global.sum(1)
        if torch.compiler.is_compiling():
            # no size read from the data inside a graph: every position is a slot, those past a row's count masked
            most = is_global.shape[1]
        else:
            most = int(counts.max())  # a size: one sync per layer, only for batches that have global tokens
            if most == 0:
                return None
        # global positions first, each group in order: keys unique per row, so any sort gives this one order (no
        # stable sort, which ONNX has no operator for)
        length = is_global.shape[1]
        key = torch.arange(length, device=is_global.device)[None, :] + length * (~is_global).long()  # [b, L]
        order = torch.argsort(key, dim=1)[:, :most]
        valid = torch.arange(most, device=is_global.device)[None, :] < counts[:, None]
        return cls(order.masked_fill(~valid, 0), valid)


def _padded_keys(mask: torch.Tensor | None, b: int, length: int, device: torch.device) -> torch.Tensor:
    """``[b, L]`` True at padded positions, from the additive padding mask ``[b, 1, 1, L]`` (or none)."""
    if mask is None:
        return torch.zeros(b, length, dtype=torch.bool, device=device)
    if mask.dim() != 4 or mask.shape[2] != 1 or mask.shape[1] != 1:
        raise InputError(
            f"the longformer attention takes a [b, k] padding mask (a [b, 1, 1, k] additive one), not one of shape "
            f"{tuple(mask.shape)}: per-query masks and position biases have no place in its window"
        )
    return is_hidden(mask[:, 0, 0, :]).expand(b, length)


def _gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x [b, h, L, d]`` at positions ``index [b, G]`` → ``[b, h, G, d]``."""
    b, h, _, d = x.shape
    return x.gather(2, index[:, None, :, None].expand(b, h, -1, d))


def _scatter_rows(x: torch.Tensor, glob: _GlobalTokens, rows: torch.Tensor) -> torch.Tensor:
    """``x [b, h, L, ·]`` with the rows of the global tokens replaced by ``rows [b, h, G, ·]`` (slots that hold no
    global token write to a spare row, dropped)."""
    b, h, length, width = x.shape
    target = torch.where(glob.valid, glob.index, length)  # [b, G]
    spare = torch.cat([x, x.new_zeros(b, h, 1, width)], dim=2)
    spare = spare.scatter(2, target[:, None, :, None].expand(b, h, -1, width), rows)
    return spare[:, :, :length]


def make_longformer_attention(
    *,
    hidden_size: int,
    num_heads: int,
    dropout: float,
    hidden_dropout: float,
    position: PositionScheme,
    options: LongformerOptions,
    layer_index: int = 0,
    norm: Callable[[], nn.Module] | None = None,
    **_: Any,
) -> LongformerAttention:
    terms = position.layer_terms(layer_index, num_heads, hidden_size // num_heads)
    if terms.bias is not None or terms.rotary is not None:
        raise LongformerAttentionError(
            "the longformer attention takes no position terms (a score bias or rotation): use position: absolute"
        )
    return LongformerAttention(
        hidden_size, num_heads, dropout, hidden_dropout, options.attention_window, norm() if norm is not None else None
    )


def longformer_is_an_encoder(config: BertConfig, spec: Any, loc: str) -> list[str]:
    """Refused at ``validate``: a decoder (no causal window, no cache) and position terms the window has no place
    for (only schemes that add an embedding, or nothing)."""
    problems = []
    if config.is_decoder:
        problems.append("the longformer attention is an encoder's: set is_decoder: false")
    if config.position.name not in ("absolute", "none"):
        problems.append(
            f"the longformer attention takes no position terms: needs position: absolute, not {config.position.name!r}"
        )
    return problems


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "attention",
            "longformer",
            make_longformer_attention,
            options=LongformerOptions,
            description="Longformer: sliding window (attention_window) + global tokens (global_attention_mask)",
            validate=longformer_is_an_encoder,
        )
    ]
