"""Attention modules: what they declare (:class:`~bertblocks.core.capabilities.AttentionCapabilities`) is what they
do: head masking and pruning agree, probabilities come back for the heads declared; what is declared absent is
refused with a :class:`~bertblocks.core.capabilities.CapabilityError`."""

from __future__ import annotations

import torch

from ...core.capabilities import CapabilityError, attention_capabilities
from ...zoo import create_model
from ..assertions import close, expect
from ..inputs import infer, padded_batch
from ..subject import ConformanceSkip, Subject


def check_attention_module(subject: Subject) -> None:
    """As declared: probabilities come back as ``[b, h, q, k]`` (``all``) or ``[b, h', q, k]`` with ``0 < h' < h``
    (``some``), rows of real queries summing to one (eager backend), and ``output_attentions`` is refused for
    ``none``; zeroing a head with ``head_mask`` equals pruning it, and ``prune_heads`` is refused when pruning is
    declared absent.
    Skipped, with the component's own reason, when it declares neither."""
    cfg = subject.config()
    cfg["encoder"]["attention"]["backend"] = "eager"
    torch.manual_seed(0)
    model = create_model(cfg, registry=subject.registry).eval()
    declared = attention_capabilities(model.encoder.layer_at(0).attention)
    inputs = padded_batch()
    absent = []
    if declared.attention_weights == "none":
        try:
            infer(model, **inputs, output_attentions=True)
        except CapabilityError:
            absent.append("attention weights")
        else:
            expect(False, "declares attention_weights='none', yet output_attentions=True ran without a CapabilityError")
    else:
        plain = infer(model, **inputs, output_attentions=True)
        for weights in plain.attentions:
            b, h, q, k = weights.shape
            if declared.attention_weights == "all":
                expect((b, h, q, k) == (3, 4, 9, 9), f"attention weights are {(b, h, q, k)}, not (3, 4, 9, 9)")
            else:
                expect(
                    (b, q, k) == (3, 9, 9) and 0 < h < 4,
                    f"attention weights are {(b, h, q, k)}; attention_weights='some' promises (3, h', 9, 9), "
                    "0 < h' < 4",
                )
            # at real queries: a padded query's row is the family's choice (transformers' Longformer zeroes it)
            real = inputs["attention_mask"].bool()[:, None, :].expand(b, h, q)
            close("attention probabilities sum to 1 at real queries", weights.sum(-1)[real], torch.ones(b, h, q)[real])
    if not declared.pruning:
        try:
            model.prune_heads({0: [0]})
        except CapabilityError:
            absent.append("pruning")
        else:
            expect(False, "declares pruning=False, yet prune_heads({0: [0]}) pruned without a CapabilityError")
    else:
        head_mask = torch.ones(2, 4)
        head_mask[:, 0] = 0.0
        masked = infer(model, **inputs, head_mask=head_mask)
        model.prune_heads({0: [0], 1: [0]})
        pruned = infer(model, **inputs)
        close("head_mask zeroing head 0 vs pruning head 0", pruned.last_hidden_state, masked.last_hidden_state)
    if len(absent) == 2:
        raise ConformanceSkip(
            declared.refusal("declares no attention weights and no pruning (both refused, as declared)")
        )
