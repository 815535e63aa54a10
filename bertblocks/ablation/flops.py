"""FLOPs per token: analytic, from the config, and counted, with ``torch.utils.flop_counter``.

Convention (the one ``FlopCounterMode`` uses): only matrix products count, one multiply-add = 2 FLOPs.
Bias adds, softmax, LayerNorm, activations, dropout and residual adds are left out (each is O(L·H) per
sequence, small beside the products), and embedding look-ups cost nothing.

For a sequence of ``L`` tokens, hidden size ``H``, feed-forward width ``I``, and per layer ``A = h·d``
(heads × head size; ``A = H`` unless heads were pruned), the forward pass costs per token::

    projections    2·H·3A + 2·A·H      Q, K, V and the output dense
    attention      2·L·A + 2·L·A       scores QKᵀ and probabilities × V
    relative bias  2·A·(2L − 1)        relative_key: queries × the (2L − 1) reachable distance rows
                   × 2                 relative_key_query: the keys too
                                       (rope, relative_bucket, symmetric_alibi, none: no products,
                                       like absolute)
    feed-forward   2·H·I + 2·I·H       (glu: 2·H·2I + 2·I·H, the gate and the up projection)
    pooler         2·H² / L            one dense on the first token of each sequence

summed over layers (each layer's heads and ``I`` after its overrides). The relative term counts
bertblocks' implementation, which multiplies by the reachable slice of the distance table instead of
forming HF's ``[L, L, d]`` table; both do the same number of useful products up to that slice.

Components the formula does not know (third-party attention, feed-forward or position schemes) are
costed as their BERT counterparts and named in the ``note``; the counted figure measures them as they
are. An attention *backend* does not change the count: a sliding-window kernel that skips work shows
it only in latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from bertblocks.config import BertConfig

_KNOWN = {
    "attention": {"bert"},
    "feedforward": {"bert", "glu"},
    # rope rotates elementwise, relative_bucket looks a shared table up, symmetric_alibi adds slope × distance,
    # none adds nothing: no products
    "position": {
        "absolute",
        "none",
        "rope",
        "relative_bucket",
        "relative_key",
        "relative_key_query",
        "symmetric_alibi",
    },
}


@dataclass(frozen=True)
class FlopEstimate:
    """Analytic FLOPs per token and what the formula had to assume."""

    per_token: float
    note: str = ""


def analytic_flops_per_token(config: BertConfig, seq_len: int) -> FlopEstimate:
    """Forward FLOPs per token of the backbone (pooler included when the config has one) at ``seq_len``.

    See the module docstring for the formula.
    """
    hidden = config.hidden_size
    length = seq_len
    assumed: list[str] = []
    position = config.position.name
    if position not in _KNOWN["position"]:
        assumed.append(f"position {position!r} as absolute")
    relative_factor = {"relative_key": 1, "relative_key_query": 2}.get(position, 0)
    total = 0.0
    for index in range(config.encoder.num_layers):
        attention, feedforward = config.encoder.layer_specs(index)
        if attention.name not in _KNOWN["attention"]:
            assumed.append(f"attention {attention.name!r} as bert")
        if feedforward.name not in _KNOWN["feedforward"]:
            assumed.append(f"feedforward {feedforward.name!r} as bert")
        heads = attention.num_heads - len(set(config.pruned_heads.get(index, [])))
        inner = heads * (hidden // attention.num_heads)  # A = h·d
        total += 2 * hidden * 3 * inner + 2 * inner * hidden
        total += 4 * length * inner
        total += relative_factor * 2 * inner * (2 * length - 1)
        inputs = 2 if feedforward.name == "glu" else 1  # a gated block projects twice on the way in
        total += 2 * hidden * feedforward.intermediate_size * (inputs + 1)
    if config.pooler is not None:
        if config.pooler.name == "first_token":
            total += 2 * hidden * hidden / length
        elif config.pooler.name != "mean":
            assumed.append(f"pooler {config.pooler.name!r} as first_token")
            total += 2 * hidden * hidden / length
    note = "; ".join(sorted(set(assumed)))
    return FlopEstimate(total, f"assumes {note}" if note else "")


def _sdpa_cpu_flops(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    # FlopCounterMode knows the CUDA fused kernels but not the CPU one; its cost is the same two products.
    return sdpa_flop_count(query, key, value)


def counted_flops(model: nn.Module, batch: int, seq_len: int, vocab_size: int) -> float:
    """Total forward FLOPs of ``model`` on one ``[batch, seq_len]`` batch, counted by ``FlopCounterMode``."""
    ids = torch.randint(0, vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops}
    was_training = model.training
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    try:
        # FlopCounterMode's module tracker hooks every module input that requires grad, which fails for a parameter
        # (or a view of one taken under no_grad) passed as a module's input: DeBERTa's shared relative table goes
        # through its LayerNorm, DeBERTa v1's through each layer's pos_proj. Frozen for the count, nothing is hooked.
        for p in trainable:
            p.requires_grad_(False)
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            model(ids)
    finally:
        for p in trainable:
            p.requires_grad_(True)
        model.train(was_training)
    return float(counter.get_total_flops())
