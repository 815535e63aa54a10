"""What a head reads from the backbone output: the pooled output, every position, or one vector per sequence
pooled with the attention mask (first token, first real token, masked mean, masked max, last real token)."""

from __future__ import annotations

from typing import Literal

import torch

from bertblocks.core.outputs import ModelOutputWithPooling
from bertblocks.plugins.poolers import masked_mean, token_mask

from ...errors import InputError

#: ``pooler``: the backbone's ``pooler_output`` ``[b, H]`` (the backbone then keeps its pooler); ``none``: every
#: position ``[b, q, H]``; ``first``: position 0; ``first_real``: the first position the mask keeps (left
#: padding); ``mean``: the masked mean; ``max``: the masked maximum per feature (SPLADE; an all-padding row gives
#: zeros); ``last``: the last position the mask keeps (a decoder's summary token)
Pooling = Literal["pooler", "none", "first", "first_real", "mean", "max", "last"]
POOLINGS: tuple[Pooling, ...] = ("pooler", "none", "first", "first_real", "mean", "max", "last")


def pool(output: ModelOutputWithPooling, attention_mask: torch.Tensor | None, pooling: Pooling) -> torch.Tensor:
    """The head's input: ``[b, H]`` (or ``[b, q, H]`` for ``none``) from the backbone output.

    Args:
        output: what the backbone returned.
        attention_mask: the mask the backbone was given (``[b, q]``, ``[b, k]`` with a cache, ``[b, q, k]``), or
            ``None``: every position is real.
        pooling: one of :data:`POOLINGS`.

    Raises:
        ValueError: ``pooler`` without a pooled output, or a mask of another rank.
    """
    if pooling == "pooler":
        if output.pooler_output is None:
            raise InputError("the head reads the pooled output, but the backbone returned none")
        return output.pooler_output
    hidden = output.last_hidden_state
    assert hidden is not None
    if pooling == "none":
        return hidden  # [b, q, H]
    mask = None if attention_mask is None else token_mask(attention_mask, hidden.shape[1])  # [b, q]
    if pooling == "mean":
        return masked_mean(hidden, mask)
    if pooling == "max":
        return masked_max(hidden, mask)
    if pooling == "first" or mask is None:
        return hidden[:, 0 if pooling != "last" else -1]
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if pooling == "first_real":
        return hidden[rows, mask.argmax(dim=-1)]  # the first 1, left or right padding alike
    return hidden[rows, mask.shape[1] - 1 - mask.flip(-1).argmax(dim=-1)]  # last: the last 1


def masked_max(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The maximum of ``hidden [b, q, n]`` over the positions ``mask [b, q]`` keeps → ``[b, n]``; a row that is
    all padding gives zeros (never ``-inf``)."""
    if mask is None:
        return hidden.amax(dim=1)
    keep = mask.bool()[..., None]  # [b, q, 1]
    lowest = torch.finfo(hidden.dtype).min
    maxed = hidden.masked_fill(~keep, lowest).amax(dim=1)  # [b, n]
    return torch.where(keep.any(dim=1), maxed, torch.zeros((), dtype=hidden.dtype, device=hidden.device))
