"""Attention kernels: ``eager`` (explicit softmax, HF's reference maths), ``sdpa`` (PyTorch's fused
``scaled_dot_product_attention``, the default) and ``sliding_window`` (local attention, as ModernBERT's
local layers)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from bertblocks.core.component import Component
from bertblocks.core.interfaces import AttentionBackend, BackendCapabilities
from bertblocks.core.masks import causal_additive, hidden_value, is_hidden
from bertblocks.errors import InputError
from bertblocks.plugins.varlen.flex import flex_available
from bertblocks.plugins.varlen.kernels import KERNELS, VarlenKernelName, varlen_kernels


class EagerBackend(AttentionBackend):
    """``softmax(QKᵀ·scale + mask) @ V`` written out, returning the probabilities when asked."""

    name = "eager"
    capabilities = BackendCapabilities(additive_mask=True, attention_weights=True, causal=True, dropout=True)

    def __call__(
        self,
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
        scores = torch.matmul(query, key.transpose(-1, -2)) * scale  # [b, h, q, k]
        if is_causal:
            scores = scores + causal_additive(*scores.shape[-2:], scores.dtype, scores.device)
        if mask is not None:
            scores = scores + mask
        probs = torch.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            probs = F.dropout(probs, p=dropout_p, training=True)
        return torch.matmul(probs, value), (probs if need_weights else None)


class SdpaOptions(BaseModel):
    """Options of the ``sdpa`` backend."""

    model_config = ConfigDict(extra="forbid")

    varlen_kernel: VarlenKernelName = Field(
        "auto",
        description="what attends a packed batch: per_sequence (one unmasked SDPA call per run of equal lengths), "
        "flex (flex_attention with a document mask, one call), flash (FlashAttention's varlen kernel, one call: "
        "CUDA, float16/bfloat16, no dropout; per_sequence where it cannot serve), or auto (flash on CUDA, "
        "per_sequence on CPU: measured fastest on each)",
    )

    @field_validator("varlen_kernel")
    @classmethod
    def _flex_exists(cls, value: str) -> str:
        if value == "flex" and not flex_available():
            raise InputError(
                f"flex needs torch.nn.attention.flex_attention (torch 2.5 or later; this is {torch.__version__})"
            )
        return value


class SdpaBackend(AttentionBackend):
    """PyTorch's fused attention. When probabilities are asked for, it computes them explicitly (the fused
    kernels never form them), so ``output_attentions=True`` works on every built-in backend. Packed batches
    get a varlen kernel instead of a re-padded, masked call: one unmasked call per sequence
    (:mod:`bertblocks.plugins.varlen.sdpa`) or one flex call with a document mask
    (:mod:`bertblocks.plugins.varlen.flex`) or FlashAttention's varlen kernel on a GPU
    (:mod:`bertblocks.plugins.varlen.flash`), chosen per device type when the backend is built
    (:mod:`bertblocks.plugins.varlen.kernels`)."""

    name = "sdpa"
    capabilities = BackendCapabilities(
        additive_mask=True, attention_weights=True, causal=True, dropout=True, varlen=True
    )

    def __init__(self, varlen_kernel: VarlenKernelName = "auto") -> None:
        self._explicit = EagerBackend()
        #: device type → varlen kernel name, resolved once here (a dict lookup per call)
        self.varlen_kernels = varlen_kernels(varlen_kernel)

    def __call__(
        self,
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
        if need_weights:
            return self._explicit(
                query,
                key,
                value,
                mask=mask,
                scale=scale,
                dropout_p=dropout_p,
                is_causal=is_causal,
                need_weights=True,
            )
        q, k = query.shape[-2], key.shape[-2]
        if is_causal and (mask is not None or q != k):
            # SDPA's own is_causal aligns top-left and cannot be combined with a mask; with a cache (q < k) or
            # a padding mask the causal part is added explicitly, aligned bottom-right.
            causal = causal_additive(q, k, query.dtype, query.device)
            mask, is_causal = (causal if mask is None else mask + causal), False
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        return out, None

    def varlen(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        scale: float,
        dropout_p: float,
    ) -> torch.Tensor:
        kernel = KERNELS[self.varlen_kernels.get(query.device.type, "per_sequence")]
        return kernel(query, key, value, cu_seqlens, scale, dropout_p, max_seqlen)

    def accepts_varlen(self, *, dropout_p: float) -> bool:
        if type(self).__call__ is not SdpaBackend.__call__ and type(self).varlen is SdpaBackend.varlen:
            # a subclass that changes the padded kernel but not this one: its packed batches must see its kernel
            return False
        if torch.compiler.is_exporting():
            # an exported graph (torch.export, ONNX) keeps to standard ops: ONNX has no translation of the custom op
            return False
        # the compiled varlen op recomputes the forward for its backward, which dropout would make differ
        return dropout_p == 0.0 or not torch.compiler.is_compiling()


class SlidingWindowOptions(BaseModel):
    """Options of the ``sliding_window`` backend."""

    model_config = ConfigDict(extra="forbid")

    window: PositiveInt = Field(
        128,
        description="total window, as ModernBERT's local_attention: a query sees keys at most window // 2 "
        "positions before or after it",
    )
    kernel: Literal["sdpa", "eager"] = Field("sdpa", description="what computes the masked attention")


class SlidingWindowBackend(AttentionBackend):
    """Local attention: query ``i`` sees key ``j`` only when ``|i - j| <= window // 2`` (transformers' ModernBERT:
    ``sliding_window = local_attention // 2``, inclusive).

    The band is added to whatever mask comes in (padding, position biases) and the masked attention runs on
    ``sdpa`` or ``eager``: the same numbers as a full kernel with that mask, without skipping the hidden blocks.
    A query that sees no key at all (a padding position whose whole window is padding) gets what transformers'
    attention of the same name gives it: zeros with ``sdpa`` (PyTorch's fused kernel on a boolean mask, the
    default), the mean of the values with ``eager`` (a softmax over equal hidden scores).
    Queries are the *last* ``q`` of the ``k`` positions (earlier ones may be cached), so query row ``r`` sits at
    position ``k - q + r``, as for the causal mask.

    Shapes::

        query [b, h, q, d]   key/value [b, h, k, d]   mask [b|1, h|1, q|1, k] additive or None
        band hidden [q, k] (bool)   → output [b, h, q, d], weights [b, h, q, k] or None
    """

    name = "sliding_window"
    capabilities = BackendCapabilities(additive_mask=True, attention_weights=True, causal=True, dropout=True)

    def __init__(self, window: int, kernel: Literal["sdpa", "eager"] = "sdpa") -> None:
        self.window = window
        self.half = window // 2
        self.kernel: AttentionBackend = SdpaBackend() if kernel == "sdpa" else EagerBackend()

    def band(self, query_length: int, key_length: int, device: torch.device) -> torch.Tensor:
        """``[q, k]`` bool, ``True`` where a key is farther than ``window // 2`` from the query."""
        q_pos = torch.arange(key_length - query_length, key_length, device=device)[:, None]
        k_pos = torch.arange(key_length, device=device)[None, :]
        return (q_pos - k_pos).abs() > self.half

    def __call__(
        self,
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
        q, k = query.shape[-2], key.shape[-2]
        # Shapes are Python ints: a window covering every key hides nothing and is skipped, so the result is
        # exactly the plain kernel's. A symbolic length (torch.export's dynamic sequence) always gets the band:
        # a branch on it would specialise the graph to sequences longer than the window.
        blind = None
        if isinstance(k, torch.SymInt) or self.half < k - 1:
            hidden = self.band(q, k, query.device)
            low = hidden_value(query.dtype)
            # filled, not added: hidden scores stay the mask's one hidden value (finite on every kernel)
            if mask is None:
                mask = torch.zeros(q, k, dtype=query.dtype, device=query.device).masked_fill(hidden, low)
            else:
                # the mask's own hidden keys take the same value (whatever hid them): one value per hidden row
                mask = torch.where(
                    hidden | is_hidden(mask), torch.tensor(low, dtype=mask.dtype, device=mask.device), mask
                )
                if isinstance(self.kernel, SdpaBackend):
                    # rows with no visible key: only padding can empty a window (the band keeps the diagonal)
                    blind = is_hidden(mask).all(dim=-1, keepdim=True)  # [b|1, h|1, q, 1]
        out, weights = self.kernel(
            query,
            key,
            value,
            mask=mask,
            scale=scale,
            dropout_p=dropout_p,
            is_causal=is_causal,
            need_weights=need_weights,
        )
        if blind is not None:
            out = out.masked_fill(blind, 0.0)
            weights = None if weights is None else weights.masked_fill(blind, 0.0)
        return out, weights


def bertblocks_register_components() -> list[Component]:
    return [
        Component("backend", "eager", lambda *, options: EagerBackend(), description="explicit softmax (reference)"),
        Component(
            "backend",
            "sdpa",
            lambda *, options: SdpaBackend(options.varlen_kernel),
            SdpaOptions,
            description="torch scaled_dot_product_attention",
        ),
        Component(
            "backend",
            "sliding_window",
            lambda *, options: SlidingWindowBackend(options.window, options.kernel),
            SlidingWindowOptions,
            description="local attention: keys within window // 2 positions (ModernBERT's local layers)",
        ),
    ]
