"""The inputs the checks feed: padded token batches (shaped for the model's head) and random query/key/value
tensors for backends and position schemes."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..core.interfaces import Head

#: the padded length of the checks' batch (:func:`padded_batch`, :func:`model_inputs`)
BATCH_LENGTH = 9
#: the shortest padded length :func:`padded_batch` makes (its row 2 keeps one token)
SHORTEST_BATCH = 6


def padded_batch(seed: int = 0, b: int = 3, length: int = BATCH_LENGTH, vocab: int = 99) -> dict[str, torch.Tensor]:
    """Padded batch: row 1 loses its last 3 tokens, row 2 its last 5 (and so on, every third row); ``length`` at
    least :data:`SHORTEST_BATCH`."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, length, dtype=torch.long)
    mask[1::3, -3:] = 0
    mask[2::3, -5:] = 0
    return {
        "input_ids": torch.randint(1, vocab, (b, length), generator=g),
        "attention_mask": mask,
        "token_type_ids": torch.randint(0, 2, (b, length), generator=g),
    }


def model_inputs(model: nn.Module, seed: int = 0, length: int = BATCH_LENGTH) -> dict[str, torch.Tensor]:
    """A padded batch for ``model``: ``[3, length]``, or ``[3, 2, length]`` for a head that reshapes its inputs
    (multiple choice overrides :meth:`~bertblocks.core.interfaces.Head.prepare_inputs`)."""
    head = getattr(model, "head", None)
    # a head may override prepare_inputs only to read them (ELECTRA's discriminator keeps the mask): it says so
    reshapes = getattr(head, "reshapes_inputs", True)
    if isinstance(head, Head) and type(head).prepare_inputs is not Head.prepare_inputs and reshapes:
        return {k: v.view(3, 2, -1) for k, v in padded_batch(seed, b=6, length=length).items()}
    return padded_batch(seed, length=length)


def qkv(
    b: int = 2, h: int = 4, q: int = 7, k: int = 7, d: int = 8, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ``[b, h, n, d]`` queries (``n = q``), keys and values (``n = k``), spread wider than unit variance
    so that softmax is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g).to(dtype) * 1.5 for n in (q, k, k))  # type: ignore[return-value]


@torch.no_grad()
def infer(model: nn.Module, **inputs: Any) -> Any:
    """``model(**inputs)`` without autograd."""
    return model(**inputs)
