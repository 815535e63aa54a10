"""Decoding through the KV cache gives what one pass gives (embeddings, positions, attention, backends,
feed-forwards, norms and layers all take part in it)."""

from __future__ import annotations

import torch

from ..assertions import close
from ..inputs import infer, padded_batch
from ..subject import Subject


def check_cache_equivalence(subject: Subject) -> None:
    """As a decoder: decoding a prefix and then the rest (in a chunk, then token by token) through the KV
    cache gives what one pass over the whole sequence gives, with and without padding."""
    model = subject.decoder()  # skips when the component refuses to be a decoder
    ids = padded_batch()["input_ids"]
    length, prefix = ids.shape[1], 4
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding: the only padding a decoder sees in generation
    for attention_mask in (None, mask):
        extra = {} if attention_mask is None else {"attention_mask": attention_mask}
        full = infer(model, input_ids=ids, **extra).last_hidden_state
        steps = [(0, prefix), (prefix, prefix + 2), *((t, t + 1) for t in range(prefix + 2, length))]
        cache = None
        for start, stop in steps:
            step_extra = {} if attention_mask is None else {"attention_mask": attention_mask[:, :stop]}
            out = infer(model, input_ids=ids[:, start:stop], past_key_values=cache, use_cache=True, **step_extra)
            cache = out.past_key_values
            got, want = out.last_hidden_state, full[:, start:stop]
            if attention_mask is not None:  # padded rows have no defined output
                keep = attention_mask[:, start:stop].bool()
                got, want = got[keep], want[keep]
            padding = "padded" if attention_mask is not None else "unpadded"
            close(f"{padding} tokens {start}..{stop - 1} through the cache vs one pass", got, want)
