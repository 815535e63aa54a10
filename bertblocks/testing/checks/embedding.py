"""Embeddings: ``inputs_embeds`` and ``past_length`` honoured."""

from __future__ import annotations

import torch

from ..assertions import close, expect
from ..inputs import padded_batch
from ..subject import Subject


def check_embedding(subject: Subject) -> None:
    """``inputs_embeds`` gives what ``input_ids`` gives, and embedding the tail with ``past_length`` gives the
    tail of the whole sequence (positions continue after a cache)."""
    emb = subject.model().embeddings
    inputs = padded_batch()
    ids, types = inputs["input_ids"], inputs["token_type_ids"]
    with torch.no_grad():
        whole = emb(ids, types, None, None)
        via_embeds = emb(None, types, None, emb.input_embeddings()(ids))
        tail = emb(ids[:, 4:], types[:, 4:], None, None, past_length=4)
    expect(tuple(whole.shape) == (*ids.shape, 32), f"embeddings of {tuple(ids.shape)} ids are {tuple(whole.shape)}")
    close("inputs_embeds vs input_ids", via_embeds, whole)
    close("tail with past_length=4 vs the whole sequence", tail, whole[:, 4:])
