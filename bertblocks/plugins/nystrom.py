"""Attention ``nystrom``: Nyströmformer's landmark attention (Xiong et al. 2021), as transformers'
``NystromformerSelfAttention`` computes it.

Written against the public plugin API only (``bertblocks.core``, ``bertblocks.config``, ``bertblocks.errors``), as a
third party would write it; any family can select it in YAML::

    encoder:
      attention: {name: nystrom, num_landmarks: 64, segment_means_seq_len: 512, conv_kernel_size: 33}

What it computes, with ``Q, K`` each divided by ``d^¼`` (transformers' order) and ``m = num_landmarks``:

* **full** (``num_landmarks == segment_means_seq_len``, the published ``uw-madison/nystromformer-512``'s settings):
  softmax attention with the padding mask, through the configured backend;
* **landmark** (otherwise): ``Q̃, K̃`` are the means of ``m`` consecutive segments of the ``L`` positions, and
  ``softmax(Q K̃ᵀ) · pinv(softmax(Q̃ K̃ᵀ)) · softmax(Q̃ Kᵀ + mask) · V``, the pseudo-inverse by 6 iterations of the
  Razavi et al. scheme from ``Z₀ = Aᵀ / c`` (``inv_coeff_init_option: false``: ``c`` the largest column sum over the
  whole batch, transformers' ``original``; ``true``: per matrix, ``1 / ‖A‖₁``). Work and memory are ``O(L·m)``;
* **convolution** (``conv_kernel_size``, or ``null`` for none): a depthwise ``[k, 1]`` convolution of each head's
  values over positions (``self.conv``, no bias) is added to the attention output.

Padding, as transformers does it: the mask enters ``softmax(Q̃ Kᵀ)`` only; the landmarks average padded positions
too, and the convolution reads padded values. So the module declares ``reads_padded_positions`` whenever it has the
landmark path or the convolution: ``packing: auto`` never packs it, and ``packing: always`` computes each sequence
alone (what transformers gives on that sequence alone). transformers 5.x reshapes by ``segment_means_seq_len``, so
its landmark path is right only for ``L == segment_means_seq_len`` (a padded batch fails there: its
``[b, 1, L, L]`` mask does not broadcast; 4.x added the ``[b, 1, 1, L]`` mask); here the segments are ``L / m``
positions of the actual ``L`` (equal at ``L == segment_means_seq_len``), and ``L`` must be a multiple of ``m``.
With ``inv_coeff_init_option: false`` the coefficient is a maximum over the batch, so a row's output depends on the
other rows of its batch (transformers' too).

Not here, as in transformers: attention-probability dropout (``attention_probs_dropout_prob`` is read and unused),
a KV cache, cross-attention, position terms; the landmark path returns no ``[b, h, q, k]`` probabilities
(transformers' ``attentions`` there are ``[b, h, L, m]``), and heads are not pruned.

Shapes::

    x [b, L, H] → Q, K, V [b, h, L, d]; Q, K ÷ d^¼
    full:      backend(Q, K, V, mask, scale 1) → [b, h, L, d]
    landmark:  Q̃, K̃ [b, h, m, d] (segment means);  k1 [b, h, L, m], k2 [b, h, m, m], k3 [b, h, m, L]
               (k1 · pinv(k2)) · (k3 · V) → [b, h, L, d]
    + conv(V) [b, h, L, d] → [b, L, h·d] → output dense → dropout → + x → norm
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator
from torch import nn

from bertblocks.config import BertConfig
from bertblocks.core.capabilities import AttentionCapabilities, CapabilityError
from bertblocks.core.component import Component
from bertblocks.core.interfaces import AttentionBackend, Positions, PositionScheme
from bertblocks.core.packing import Packing
from bertblocks.errors import BertBlocksError, InputError

from .projections import AttentionOutput, EncoderOnlyAttention, QKVProjections

#: iterations of the pseudo-inverse (transformers' ``iterative_inv(n_iter=6)``)
PINV_ITERATIONS = 6


class NystromAttentionError(BertBlocksError, ValueError):
    """A ``nystrom`` attention asked for what it cannot be: an even convolution, a length its segments do not
    divide, a position term or mask it has no place for."""


class NystromOptions(BaseModel):
    """Options of the ``nystrom`` attention (transformers' ``NystromformerConfig`` names)."""

    model_config = ConfigDict(extra="forbid")

    num_landmarks: PositiveInt = Field(
        64,
        description="landmarks m: segment means of the queries and keys (the landmark path when != "
        "segment_means_seq_len)",
    )
    segment_means_seq_len: PositiveInt = Field(
        64, description="equal to num_landmarks: full softmax attention (transformers' switch); else the landmark path"
    )
    conv_kernel_size: PositiveInt | None = Field(
        65, description="odd width of the depthwise convolution over each head's values (self.conv); null: none"
    )
    inv_coeff_init_option: bool = Field(
        False,
        description="pseudo-inverse start Z0 = A^T / c: false: c the largest column sum over the batch "
        "(transformers' original); true: per matrix, 1/||A||_1",
    )

    @model_validator(mode="after")
    def _odd(self) -> NystromOptions:
        if self.conv_kernel_size is not None and self.conv_kernel_size % 2 == 0:
            # transformers pads k // 2 on each side: an even k makes the convolution one position longer, and its
            # model fails adding it
            raise NystromAttentionError(
                f"conv_kernel_size {self.conv_kernel_size} must be odd (the window is centred on each position)"
            )
        return self

    @property
    def landmarks(self) -> bool:
        """Whether the landmark path runs (transformers' test: ``num_landmarks != segment_means_seq_len``)."""
        return self.num_landmarks != self.segment_means_seq_len


class NystromProjections(QKVProjections):
    """transformers' ``NystromformerSelfAttention`` parameters (its child name is ``self``): ``query``, ``key``,
    ``value`` and the depthwise ``conv`` (``[h, 1, k, 1]``, no bias)."""

    def __init__(self, hidden_size: int, num_heads: int, kernel_size: int | None) -> None:
        super().__init__(hidden_size, hidden_size)
        if kernel_size is not None:
            self.conv = nn.Conv2d(
                num_heads, num_heads, (kernel_size, 1), padding=(kernel_size // 2, 0), bias=False, groups=num_heads
            )


def iterative_inverse(matrix: torch.Tensor, exact_init: bool, iterations: int = PINV_ITERATIONS) -> torch.Tensor:
    """Moore-Penrose pseudo-inverse of ``matrix [b, h, m, m]`` (rows of a softmax) by the iterative method,
    transformers' ``iterative_inv`` step for step.

    ``exact_init`` False: ``Z₀ = Aᵀ / max(column sums)`` over the *whole* tensor (transformers' ``original``);
    True: the maximum per matrix.
    """
    identity = torch.eye(matrix.shape[-1], device=matrix.device, dtype=matrix.dtype)
    column_sums = matrix.sum(dim=-2)  # [b, h, m]
    if exact_init:
        value = 1 / column_sums.max(dim=-1).values[:, :, None, None] * matrix.transpose(-1, -2)
    else:
        value = 1 / column_sums.max() * matrix.transpose(-1, -2)
    for _ in range(iterations):
        kv = matrix @ value
        value = (0.25 * value) @ (13 * identity - kv @ (15 * identity - kv @ (7 * identity - kv)))
    return value


class NystromAttention(EncoderOnlyAttention):
    """Nyströmformer's self-attention sub-layer (see the module docstring).

    Args:
        hidden_size: ``H``.
        num_heads: ``h``; ``d = H // h``.
        hidden_dropout: dropout before the residual.
        backend: the kernel of the full path (the landmark path computes its three kernels itself).
        norm: the norm after the residual (post-LN); ``None`` for a layer that normalises itself.
        options: :class:`NystromOptions`.
    """

    kind = "nystrom"

    def __init__(
        self,
        *,
        hidden_size: int,
        num_heads: int,
        hidden_dropout: float,
        backend: AttentionBackend,
        norm: nn.Module | None,
        options: NystromOptions,
    ) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise InputError(f"num_heads {num_heads} must divide hidden_size {hidden_size}")
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.options = options
        self.landmarks = options.landmarks
        # the landmarks average padded positions and the convolution reads padded values (as transformers')
        self.reads_padded_positions = self.landmarks or options.conv_kernel_size is not None
        self.capabilities = AttentionCapabilities(
            attention_weights="none" if self.landmarks else "all",
            pruning=False,
            cache=False,
            reason="Nyströmformer's attention is an encoder's (no KV cache); its landmark path has no [q, k] "
            "probabilities, and its heads (with their convolution) are not pruned",
        )
        # the landmark path computes its kernels itself: it holds no backend (none would be called)
        self.backend = None if self.landmarks else backend
        self.self = NystromProjections(hidden_size, num_heads, options.conv_kernel_size)  # `self`: HF's child name
        self.output = AttentionOutput(hidden_size, hidden_size, 0.0, hidden_dropout, norm)  # norm: built, or None

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
            raise CapabilityError("the nystrom attention takes no position score bias (its positions are embedded)")
        if output_attentions and (self.backend is None or not self.backend.capabilities.attention_weights):
            raise CapabilityError(
                self.capabilities.refusal("output_attentions=True: the nystrom attention cannot return them here")
            )
        if packing is not None:
            # packed only under `packing: always` (the declaration keeps `auto` from packing): each sequence is
            # computed alone, as transformers computes it alone (its landmarks, its convolution's zeros past the end)
            return self._each_alone(hidden_states, head_mask, packing), None
        return self._attend(hidden_states, mask, head_mask, output_attentions)

    def _each_alone(
        self, hidden_states: torch.Tensor, head_mask: torch.Tensor | None, packing: Packing
    ) -> torch.Tensor:
        """``[1, T, H]`` packed → each sequence through :meth:`_attend` without padding → ``[1, T, H]``."""
        bounds = packing.cu_seqlens.tolist()  # one sync: the loop needs the lengths on the host
        pieces = [
            self._attend(hidden_states[:, start:end], None, head_mask, False)[0]
            for start, end in pairwise(bounds)
            if end > start
        ]
        return torch.cat(pieces, dim=1)

    def _attend(
        self,
        hidden: torch.Tensor,  # [b, L, H]
        mask: torch.Tensor | None,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, length, _ = hidden.shape
        h, d = self.num_heads, self.head_dim
        proj = self.self
        # transformers divides queries and keys (not the scores) by √√d
        root = d**0.25
        query = self._heads(proj.query(hidden)) / root  # [b, h, L, d]
        key = self._heads(proj.key(hidden)) / root
        value = self._heads(proj.value(hidden))
        weights = None
        if self.backend is None:
            context = self._landmark(query, key, value, mask)
        else:
            context, weights = self.backend(
                query, key, value, mask=mask, scale=1.0, dropout_p=0.0, is_causal=False, need_weights=output_attentions
            )
        if head_mask is not None:  # scales each head's attention (the convolution is no attention)
            factor = head_mask.view(1, h, 1, 1)
            context = context * factor
            weights = weights * factor if weights is not None else None
        if hasattr(proj, "conv"):
            context = context + proj.conv(value)  # [b, h, L, d]: each head's values over positions
        context = context.transpose(1, 2).reshape(b, length, h * d)
        return self.output(context, hidden), weights

    def _landmark(
        self,
        query: torch.Tensor,  # [b, h, L, d], already ÷ d^¼
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        b, h, length, d = query.shape
        m = self.options.num_landmarks
        if length % m:
            raise NystromAttentionError(
                f"the nystrom attention's landmark path splits the {length} positions into num_landmarks={m} segments "
                f"of equal length: pad the batch to a multiple of {m} (transformers' Nyströmformer takes exactly "
                f"segment_means_seq_len={self.options.segment_means_seq_len} positions)"
            )
        if mask is not None and (mask.dim() != 4 or mask.shape[2] != 1):
            raise NystromAttentionError(
                f"the nystrom attention's landmark path takes a padding mask [b, 1, 1, L], not one of shape "
                f"{tuple(mask.shape)}: per-query masks have no place in its landmark kernels"
            )
        q_landmarks = query.reshape(b, h, m, length // m, d).mean(dim=-2)  # [b, h, m, d]
        k_landmarks = key.reshape(b, h, m, length // m, d).mean(dim=-2)
        kernel_1 = torch.softmax(query @ k_landmarks.transpose(-1, -2), dim=-1)  # [b, h, L, m]
        kernel_2 = torch.softmax(q_landmarks @ k_landmarks.transpose(-1, -2), dim=-1)  # [b, h, m, m]
        scores = q_landmarks @ key.transpose(-1, -2)  # [b, h, m, L]
        if mask is not None:  # transformers masks this kernel only
            scores = scores + mask
        kernel_3 = torch.softmax(scores, dim=-1)
        inverse = iterative_inverse(kernel_2, self.options.inv_coeff_init_option)
        return (kernel_1 @ inverse) @ (kernel_3 @ value)  # [b, h, L, d]

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, t, h·d]`` → ``[b, h, t, d]``."""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def prune_heads(self, heads: set[int]) -> None:
        raise CapabilityError(self.capabilities.refusal("the nystrom attention cannot prune heads"))


def make_nystrom_attention(
    *,
    hidden_size: int,
    num_heads: int,
    hidden_dropout: float,
    backend: AttentionBackend,
    position: PositionScheme,
    options: NystromOptions,
    layer_index: int = 0,
    norm: Callable[[], nn.Module] | None = None,
    **_: Any,
) -> NystromAttention:
    terms = position.layer_terms(layer_index, num_heads, hidden_size // num_heads)
    if terms.bias is not None or terms.rotary is not None or position.adds_score_bias:
        raise NystromAttentionError(
            "the nystrom attention takes no position terms (a score bias or rotation): use position: absolute (or none)"
        )
    return NystromAttention(
        hidden_size=hidden_size,
        num_heads=num_heads,
        hidden_dropout=hidden_dropout,
        backend=backend,
        norm=norm() if norm is not None else None,
        options=options,
    )


def nystrom_is_an_encoder(config: BertConfig, spec: Any, loc: str) -> list[str]:
    """Refused at ``validate``: a decoder or cross-attention (no causal landmarks, no cache) and position terms
    the landmarks have no place for (only schemes that add an embedding, or nothing)."""
    problems = []
    if config.is_decoder:
        problems.append(
            "the nystrom attention is an encoder's (its landmarks average every position): set is_decoder: false"
        )
    if config.add_cross_attention:
        problems.append("the nystrom attention has no cross-attention (add_cross_attention: true)")
    if config.position.name not in ("absolute", "none"):
        problems.append(
            f"the nystrom attention takes no position terms: needs position: absolute, not {config.position.name!r}"
        )
    return problems


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "attention",
            "nystrom",
            make_nystrom_attention,
            options=NystromOptions,
            description="Nyströmformer: landmark (segment-mean) attention with a pseudo-inverse, depthwise value "
            "convolution",
            validate=nystrom_is_an_encoder,
        )
    ]
