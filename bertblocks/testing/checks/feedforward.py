"""Feed-forward blocks: position-wise (permutation-equivariant, chunkable)."""

from __future__ import annotations

import torch

from ...zoo import create_model
from ..assertions import close, expect
from ..inputs import infer, padded_batch
from ..subject import Subject


def check_feedforward_position_wise(subject: Subject) -> None:
    """The block acts on each position alone: permuting positions permutes the output, and running it in
    chunks (``chunk_size_feed_forward``) changes nothing."""
    model = subject.model()
    layer = model.encoder.layer[0]
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 9, 32, generator=g)
    perm = torch.randperm(9, generator=g)
    with torch.no_grad():
        out = layer.output(layer.intermediate(hidden), hidden)
        permuted = layer.output(layer.intermediate(hidden[:, perm]), hidden[:, perm])
    expect(tuple(out.shape) == (3, 9, 32), f"feed-forward output is {tuple(out.shape)}, not (3, 9, 32)")
    close("permuted positions", permuted, out[:, perm])
    cfg = subject.config()
    cfg["encoder"]["chunk_size_feed_forward"] = 2
    torch.manual_seed(0)
    chunked = create_model(cfg, registry=subject.registry).eval()
    chunked.load_state_dict(model.state_dict())
    inputs = padded_batch()
    close(
        "chunk_size_feed_forward=2 vs none",
        infer(chunked, **inputs).last_hidden_state,
        infer(model, **inputs).last_hidden_state,
    )
