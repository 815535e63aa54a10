"""Attention masks in Hugging Face's convention, built once per forward pass.

Shapes::

    padding mask   [b, k]       1 = attend, 0 = padding           (what tokenizers return)
    3-D mask       [b, q, k]    per query row                     (used as mask[:, None])
    additive mask  [b, 1, q|1, k]  0.0 where visible, hidden_value(dtype) = finfo(dtype).min / 2 where masked

The additive form is ``(1 - m) * hidden_value(dtype)``: transformers' ``get_extended_attention_mask`` with half of
its ``finfo(dtype).min`` (why half: :func:`hidden_value`). Masked scores are a large finite negative number (never
``-inf``), so a fully padded row still gives finite probabilities, the uniform softmax HF's eager attention gives it.
Every mask that hides keys from a backend takes its value from :func:`hidden_value` and is read back with
:func:`is_hidden`.
"""

from __future__ import annotations

import torch

from ..errors import InputError


def hidden_value(dtype: torch.dtype) -> float:
    """What an additive mask adds to the score of a hidden key: ``torch.finfo(dtype).min / 2``.

    Why not ``finfo.min`` itself, transformers' value: CUDA's memory-efficient SDPA kernel computes its softmax with
    ``exp2``, multiplying the masked scores by ``log2(e) ≈ 1.44`` first. A row whose every key is hidden (an
    all-padding row of a batch, DeBERTa's padded queries, a left-padded decoder's first queries) holds ``finfo.min``
    there, which that product overflows to ``-inf``: the row came out as zeros on an H100, where eager attention and
    transformers give the uniform softmax. Half of ``finfo.min`` stays finite through that product (and through the
    sum of two hidden entries, or a position bias added to one in float16), and hides a key as completely: both
    ``exp(finfo.min - max)`` and ``exp(finfo.min / 2 - max)`` are exactly 0, so every row with a visible key gets
    transformers' probabilities bit for bit, and a fully hidden row the uniform softmax transformers' eager
    attention gives it in float32 and bfloat16 (where every score of the row rounds to the hidden value itself).
    """
    return torch.finfo(dtype).min / 2


def is_hidden(mask: torch.Tensor) -> torch.Tensor:
    """Where an additive mask hides the key: at or below a quarter of ``finfo.min``, midway between a hidden entry
    (:func:`hidden_value`, plus any finite bias, stays below it) and a visible one (``0`` plus a bias, far above).
    A mask built with transformers' ``finfo.min`` reads as hidden too."""
    return mask <= torch.finfo(mask.dtype).min / 4


def check_attention_mask(mask: torch.Tensor, batch_size: int, query_length: int, key_length: int) -> None:
    """Raise a clear ``ValueError`` unless ``mask`` is ``[b, k]`` or ``[b, q, k]`` for this input."""
    if mask.dim() == 2:
        expected: tuple[int, ...] = (batch_size, key_length)
    elif mask.dim() == 3:
        expected = (batch_size, query_length, key_length)
    else:
        raise InputError(
            f"attention_mask must be 2-D [batch, key_len] or 3-D [batch, query_len, key_len]; "
            f"got {mask.dim()}-D with shape {tuple(mask.shape)}"
        )
    if tuple(mask.shape) != expected:
        raise InputError(
            f"attention_mask has shape {tuple(mask.shape)} but the input needs {expected} "
            f"(batch={batch_size}, query_len={query_length}, key_len={key_length}, where key_len counts "
            f"cached positions too)"
        )
    if mask.dtype != torch.bool and not torch.compiler.is_compiling() and mask.numel():
        # (1 - m) * finfo.min turns any value other than 0 or 1 into a huge bias of either sign, so an
        # additive mask (0 / -10000) or a count passed by mistake would silently give wrong numbers
        low, high = (v.item() for v in torch.aminmax(mask))
        if low != low or high != high:  # NaN (aminmax propagates it): would give NaN outputs silently
            raise InputError("attention_mask holds NaN: pass a 0/1 padding mask (1 = attend)")
        if low < 0 or high > 1:
            raise InputError(
                f"attention_mask holds values outside [0, 1] (min {low}, max {high}): pass a 0/1 padding mask "
                "(1 = attend), not an additive mask"
            )


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[b, k]`` or ``[b, q, k]`` 0/1 mask → ``[b, 1, 1|q, k]`` additive float mask in ``dtype``."""
    extended = mask[:, None, None, :] if mask.dim() == 2 else mask[:, None, :, :]
    extended = extended.to(dtype)
    return (1.0 - extended) * hidden_value(dtype)


def causal_mask(
    padding: torch.Tensor | None,
    batch_size: int,
    query_length: int,
    past_length: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Decoder mask ``[b, 1, q, past + q]``: query ``i`` sees cached positions and new positions ``<= i``.

    Combined (multiplied) with an optional ``[b, past + q]`` padding mask before the additive transform,
    as transformers' ``get_extended_attention_mask`` does for decoders.
    """
    key_length = past_length + query_length
    q = torch.arange(query_length, device=device)[:, None] + past_length
    k = torch.arange(key_length, device=device)[None, :]
    allowed = (k <= q).to(dtype)[None, None]  # [1, 1, q, k]
    if padding is not None:
        pad = padding[:, None, None, :] if padding.dim() == 2 else padding[:, None, :, :]
        allowed = allowed * pad.to(dtype)
    else:
        allowed = allowed.expand(batch_size, 1, query_length, key_length)
    return (1.0 - allowed) * hidden_value(dtype)


def causal_additive(query_length: int, key_length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[q, k]`` additive causal mask aligned bottom-right: the queries are the *last* ``q`` of ``k`` positions
    (earlier ones are cached), so query ``i`` sees keys ``<= k - q + i``."""
    hidden = torch.ones(query_length, key_length, dtype=torch.bool, device=device).triu(key_length - query_length + 1)
    return torch.zeros(query_length, key_length, dtype=dtype, device=device).masked_fill(hidden, hidden_value(dtype))


def is_all_visible(mask: torch.Tensor | None) -> bool:
    """True when a 0/1 mask hides nothing, so an attention kernel may run without a mask at all.

    Under ``torch.compile`` we cannot branch on data, so the mask is always kept there.
    """
    if mask is None:
        return True
    if torch.compiler.is_compiling():
        return False
    return bool(mask.min() >= 1) if mask.is_floating_point() else bool(mask.all())
