"""Autoregressive generation with the KV cache: greedy or sampled (temperature, top-k, top-p).

Works with any causal LM whose forward takes HF's decoder arguments and returns ``logits`` and
``past_key_values`` (``bertblocks.BertLMHeadModel``, or the decoder of an encoder-decoder).

Padding: prompts of different lengths are generated as one batch. Right-padded prompts are moved to the
left first (new tokens must follow each prompt's last real token); positions count real tokens only, so a
padded row generates what it would generate alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import InputError


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's padding to the left, keeping the order of its real tokens (no-op if already so)."""
    order = torch.argsort(attention_mask, dim=1, stable=True)  # pads (0) first, real tokens (1) after
    return input_ids.gather(1, order), attention_mask.gather(1, order)


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Keep the ``top_k`` most likely tokens and the smallest set whose probability reaches ``top_p``."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens before it already reach top_p (the first token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.no_grad()
def generate(
    model: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int = 20,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    encoder_hidden_states: torch.Tensor | None = None,
    encoder_attention_mask: torch.Tensor | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Continue ``input_ids`` by up to ``max_new_tokens`` tokens.

    Args:
        model: a causal LM (``bertblocks.BertLMHeadModel``) in eval mode.
        input_ids: ``[b, L]`` prompts; padded rows need ``attention_mask``.
        attention_mask: ``[b, L]``, 1 for real tokens. Left or right padding.
        max_new_tokens: tokens to add at most.
        do_sample: sample from the (filtered) distribution instead of taking the most likely token.
        temperature, top_k, top_p: sampling controls (``top_k=0`` and ``top_p=1`` disable the filters).
        eos_token_id: a row stops after producing it; generation stops when every row has.
        pad_token_id: written after a row has stopped (default: ``eos_token_id``, else 0).
        encoder_hidden_states, encoder_attention_mask: for decoders with cross-attention.
        use_cache: reuse keys/values between steps (``False`` recomputes the whole sequence every step; the
            same tokens, for comparison).
        generator: random generator for reproducible sampling.

    Returns:
        ``[b, L' + n]``: the (left-aligned) prompts followed by the new tokens.

    Raises:
        ValueError: bad shapes or sampling parameters.
    """
    if input_ids.dim() != 2:
        raise InputError(f"input_ids must be [batch, seq]; got shape {tuple(input_ids.shape)}")
    if max_new_tokens < 0:
        raise InputError("max_new_tokens must be >= 0")
    if do_sample and (temperature <= 0 or not 0 < top_p <= 1 or top_k < 0):
        raise InputError("sampling needs temperature > 0, 0 < top_p <= 1 and top_k >= 0")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    elif attention_mask.shape != input_ids.shape:
        raise InputError(
            f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}; "
            f"got {tuple(attention_mask.shape)}"
        )
    if bool((attention_mask.sum(dim=1) == 0).any()):
        raise InputError("every prompt needs at least one real token")
    input_ids, attention_mask = left_align(input_ids, attention_mask)
    pad = pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0)
    encoder_kwargs = {}
    if encoder_hidden_states is not None:
        encoder_kwargs = {
            "encoder_hidden_states": encoder_hidden_states,
            "encoder_attention_mask": encoder_attention_mask,
        }

    # Without padding the model's defaults are the right positions and mask: skip building them each step.
    padded = bool((attention_mask == 0).any())
    sequences, mask = input_ids, attention_mask
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    cache = None
    step_ids = sequences
    for _ in range(max_new_tokens):
        # positions count real tokens, so a left-padded row sees the positions it would see alone
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0) if padded else None
        if use_cache and cache is not None:
            out = model(
                input_ids=step_ids,
                attention_mask=mask if padded else None,
                position_ids=positions[:, -1:] if positions is not None else None,
                past_key_values=cache,
                use_cache=True,
                **encoder_kwargs,
            )
        else:
            out = model(
                input_ids=sequences,
                attention_mask=mask if padded else None,
                position_ids=positions,
                use_cache=use_cache,
                **encoder_kwargs,
            )
        cache = out.past_key_values if use_cache else None
        logits = out.logits[:, -1, :].float()  # [b, vocab]
        if do_sample:
            logits = _filter_logits(logits / temperature, top_k, top_p)
            next_tokens = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)
        else:
            next_tokens = logits.argmax(dim=-1)
        next_tokens = torch.where(finished, torch.full_like(next_tokens, pad), next_tokens)
        sequences = torch.cat([sequences, next_tokens[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        step_ids = next_tokens[:, None]
        if eos_token_id is not None:
            finished |= next_tokens == eos_token_id
            if bool(finished.all()):
                break
    return sequences
