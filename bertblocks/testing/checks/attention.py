"""Attention modules: head masking and pruning agree; probabilities come back in their documented shape."""

from __future__ import annotations

import torch

from ...zoo import create_model
from ..assertions import close, expect
from ..inputs import infer, padded_batch
from ..subject import Subject


def check_attention_module(subject: Subject) -> None:
    """Zeroing a head with ``head_mask`` equals pruning it, and probabilities come back as ``[b, h, q, k]``
    rows summing to one (eager backend)."""
    cfg = subject.config()
    cfg["encoder"]["attention"]["backend"] = "eager"
    torch.manual_seed(0)
    model = create_model(cfg, registry=subject.registry).eval()
    inputs = padded_batch()
    head_mask = torch.ones(2, 4)
    head_mask[:, 0] = 0.0
    out = infer(model, **inputs, head_mask=head_mask, output_attentions=True)
    for weights in out.attentions:
        expect(tuple(weights.shape) == (3, 4, 9, 9), f"attention weights are {tuple(weights.shape)}, not (3, 4, 9, 9)")
    plain = infer(model, **inputs, output_attentions=True)
    for weights in plain.attentions:
        close("attention probabilities sum to 1", weights.sum(-1), torch.ones(3, 4, 9))
    model.prune_heads({0: [0], 1: [0]})
    pruned = infer(model, **inputs)
    close("head_mask zeroing head 0 vs pruning head 0", pruned.last_hidden_state, out.last_hidden_state)
