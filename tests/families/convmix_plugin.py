"""A third-party plugin written against the public API only, as a plugin package would hold it: what the two
plugins of issue 31 (ConvBERT, sigmoid attention) needed, kept small so that these paths stay exercised.

* ``convmix`` (attention): ConvBERT's mixed attention, reduced: ``h / head_ratio`` softmax heads through the
  configured backend, and a depthwise convolution over the sequence for the other channels. The convolution reads
  the hidden states at padded positions (as transformers' ConvBERT does), so it declares
  ``reads_padded_positions``; it returns probabilities for its softmax heads only (``attention_weights="some"``)
  and can neither be pruned nor decode through a cache: both declared, with reasons.
* ``sigmoid`` (backend): ``sigmoid(QKᵀ·scale + mask − log n) V`` with ``n`` the keys a query sees; not softmax,
  so its reference is :func:`sigmoid_reference`, the formula written out loop by loop.
* ``myconvbert`` (family): a ``config.json`` whose model is built with ``convmix``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.config import BertConfig
from bertblocks.core.capabilities import AttentionCapabilities
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Attention, AttentionBackend, BackendCapabilities
from bertblocks.core.masks import causal_additive, is_hidden
from bertblocks.families.bertlike import bert_fields_from_hf, bert_fields_to_hf
from bertblocks.families.family import Family
from bertblocks.families.keymap import KeyMap


# ------------------------------------------------------------------------------------------ convmix attention
class ConvMixOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    head_ratio: PositiveInt = Field(2, description="1 in head_ratio heads is softmax attention; the rest convolve")
    conv_kernel_size: PositiveInt = Field(3, description="odd width of the depthwise convolution over positions")


class ConvMixAttention(Attention):
    """Softmax heads plus a depthwise convolution over positions.

    Shapes::

        hidden [b, q, H] → Q, K, V [b, a, q, d] (a = h / head_ratio softmax heads) → backend → [b, q, a·d]
        hidden [b, q, H] → value [b, H - a·d, q] → depthwise conv over q → [b, q, H - a·d]
        concat → output dense → dropout → + residual → norm
    """

    # the convolution reads padded positions: automatic packing stays off for a model holding this module
    reads_padded_positions = True
    capabilities = AttentionCapabilities(
        attention_weights="some",
        pruning=False,
        cache=False,
        reason="the convolution heads read every channel of every position, padded ones and later ones included",
    )

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        hidden_dropout: float,
        backend: AttentionBackend,
        norm: nn.Module | None,
        options: ConvMixOptions,
    ) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.attention_heads = max(1, num_heads // options.head_ratio)
        width = self.attention_heads * self.head_dim
        self.query = nn.Linear(hidden_size, width)
        self.key = nn.Linear(hidden_size, width)
        self.value = nn.Linear(hidden_size, width)
        self.conv_value = nn.Linear(hidden_size, hidden_size - width)
        k = options.conv_kernel_size
        # a standard torch layer: bertblocks initialises it as it does nn.Linear (no subclass needed)
        self.conv = nn.Conv1d(hidden_size - width, hidden_size - width, k, padding=k // 2, groups=hidden_size - width)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(hidden_dropout)
        self.norm = norm
        self.backend = backend
        self.dropout_p = dropout

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        positions: Any,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        encoder_hidden_states: torch.Tensor | None = None,
        cache: Any = None,
        layer_index: int = 0,
        is_causal: bool = False,
        packing: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if packing is not None:  # packed only under `packing: always`: work in the padded layout
            padded, weights = self.forward(
                packing.unpack(hidden_states[0]),
                mask=mask,
                positions=positions,
                head_mask=head_mask,
                output_attentions=output_attentions,
                is_causal=is_causal,
            )
            return packing.pack(padded)[None], weights
        b, q, _ = hidden_states.shape
        a, d = self.attention_heads, self.head_dim

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, q, a, d).transpose(1, 2)  # [b, a, q, d]

        query, key, value = (
            heads(self.query(hidden_states)),
            heads(self.key(hidden_states)),
            heads(self.value(hidden_states)),
        )
        context, weights = self.backend(
            query,
            key,
            value,
            mask=mask,
            scale=d**-0.5,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=is_causal and q > 1,
            need_weights=output_attentions,
        )
        if head_mask is not None:  # the softmax heads are the first `a` of the layer's heads
            factor = head_mask[:a].view(1, a, 1, 1)
            context = context * factor
            weights = weights * factor if weights is not None else None
        attended = context.transpose(1, 2).reshape(b, q, a * d)  # [b, q, a·d]
        convolved = self.conv(self.conv_value(hidden_states).transpose(1, 2)).transpose(1, 2)  # [b, q, H - a·d]
        out = self.dropout(self.dense(torch.cat([attended, convolved], dim=-1)))
        return (self.norm(out + hidden_states) if self.norm is not None else out), weights

    def prune_heads(self, heads: set[int]) -> None:
        raise NotImplementedError("declared: capabilities.pruning is False")


def make_convmix(
    *,
    hidden_size: int,
    num_heads: int,
    dropout: float,
    hidden_dropout: float,
    backend: AttentionBackend,
    norm: Callable[[], nn.Module] | None,
    options: ConvMixOptions,
    **_: Any,
) -> ConvMixAttention:
    return ConvMixAttention(
        hidden_size, num_heads, dropout, hidden_dropout, backend, norm() if norm is not None else None, options
    )


def convmix_needs_absolute_positions(config: BertConfig, spec: Any, loc: str) -> list[str]:
    # the softmax heads take no position terms (no bias, no rotation)
    return [] if config.position.name == "absolute" else ["convmix takes no position terms: needs position: absolute"]


# ------------------------------------------------------------------------------------------- sigmoid backend
def visible_counts(scores: torch.Tensor) -> torch.Tensor:
    """Keys each query sees (scores the mask did not hide: :func:`~bertblocks.core.masks.is_hidden`), at least 1:
    ``[..., q, 1]``."""
    return (~is_hidden(scores)).sum(-1, keepdim=True).clamp(min=1).to(scores.dtype)


class SigmoidBackend(AttentionBackend):
    """``sigmoid(QKᵀ·scale + mask − log n) @ V``: weights in (0, 1), not normalised; ``n`` counts the keys a
    query sees (after padding and causal masking)."""

    name = "sigmoid"
    # attention_weights: the weights the output is a weighted sum with (here sigmoids, not probabilities)
    capabilities = BackendCapabilities(additive_mask=True, attention_weights=True, causal=True, dropout=True)

    def __call__(self, query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):  # type: ignore[no-untyped-def]
        scores = torch.matmul(query, key.transpose(-1, -2)) * scale  # [b, h, q, k]
        if is_causal:
            scores = scores + causal_additive(*scores.shape[-2:], scores.dtype, scores.device)
        if mask is not None:
            scores = scores + mask
        weights = torch.sigmoid(scores - visible_counts(scores).log())
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p, training=True)
        return torch.matmul(weights, value), (weights if need_weights else None)


def sigmoid_reference(query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):  # type: ignore[no-untyped-def]
    """The sigmoid attention formula written out one score at a time, in float64: the plugin's reference."""
    b, h, q, d = query.shape
    k = key.shape[2]
    low = torch.finfo(query.dtype).min
    out = torch.zeros(b, h, q, value.shape[-1], dtype=torch.float64)
    weights = torch.zeros(b, h, q, k, dtype=torch.float64)
    for i in range(b):
        for j in range(h):
            for t in range(q):
                scores = []
                for s in range(k):
                    score = sum(float(query[i, j, t, c]) * float(key[i, j, s, c]) for c in range(d)) * scale
                    if is_causal and s > k - q + t:  # bottom-right: the queries are the last q of k
                        score += low
                    if mask is not None:
                        m = mask[min(i, mask.shape[0] - 1), min(j, mask.shape[1] - 1), min(t, mask.shape[2] - 1), s]
                        score += float(m)
                    scores.append(score)
                n = max(1, sum(score > low / 2 for score in scores))
                for s, score in enumerate(scores):
                    weights[i, j, t, s] = 1.0 / (1.0 + math.exp(min(-(score - math.log(n)), 700.0)))
                out[i, j, t] = weights[i, j, t] @ value[i, j].double()
    return out.to(query.dtype), (weights.to(query.dtype) if need_weights else None)


# ------------------------------------------------------------------------------------------------- the family
def myconvbert_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = dict(hf)
    mix = {"head_ratio": src.pop("head_ratio", 2), "conv_kernel_size": src.pop("conv_kernel_size", 3)}
    data = bert_fields_from_hf(src)
    data.setdefault("encoder", {}).setdefault("attention", {}).update({"name": "convmix", **mix})
    return data


def myconvbert_to_hf(config: BertConfig) -> dict[str, Any]:
    attention = config.encoder.attention
    if attention.name != "convmix":
        raise ValueError(f"myconvbert models use the convmix attention, not {attention.name!r}")
    out = bert_fields_to_hf(config)
    options = attention.options()  # the component's own options, defaults filled in by validation
    out["head_ratio"] = options["head_ratio"]
    out["conv_kernel_size"] = options["conv_kernel_size"]
    return out


MYCONVBERT = Family(
    model_type="myconvbert",
    config_from_hf=myconvbert_from_hf,
    config_to_hf=myconvbert_to_hf,
    key_map=KeyMap(prefix="myconvbert", head_prefixes=("cls.", "classifier.")),
    architectures={"MyConvBertForMaskedLM": "masked_lm"},
    base_architecture="MyConvBertModel",
    description="BERT with convmix attention",
)


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "attention",
            "convmix",
            make_convmix,
            options=ConvMixOptions,
            description="softmax heads + a depthwise convolution (ConvBERT-like)",
            validate=convmix_needs_absolute_positions,
        ),
        Component("backend", "sigmoid", lambda **_: SigmoidBackend(), description="sigmoid attention"),
        Component("family", "myconvbert", lambda **_: MYCONVBERT, description=MYCONVBERT.description),
    ]
