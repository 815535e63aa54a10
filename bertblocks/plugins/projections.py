"""The projections every built-in attention kind is made of, under transformers' names so checkpoints load unchanged:
``attention.self.{query,key,value}`` (:func:`qkv_linears`, :class:`QKVProjections`) and ``attention.output.{dense,
LayerNorm}`` (:class:`AttentionOutput`).

BERT's attention (:mod:`.attention`, which may instead fuse the three into one ``Wqkv``), Longformer's banded
attention (plus its global projections), Nyströmformer's (plus its value convolution), BigBird's block-sparse
attention (plus a rotary module) and ConvBERT's mixed attention (plus its convolutions) all build their query, key,
value and output projections here: one place for their shapes, biases and key names.
"""

from __future__ import annotations

import torch
from torch import nn

from .feedforward import ResidualOutput


def qkv_linears(
    hidden_size: int,
    width: int,
    bias: bool = True,
    *,
    kv_width: int | None = None,
    value_input_size: int | None = None,
) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
    """The query, key and value projections ``[..., H]`` → ``[..., width]``.

    Args:
        hidden_size: the input width ``H``.
        width: the query's output width (``h·d``).
        bias: biases on all three.
        kv_width: the key's and value's output width, where it differs (grouped-query attention); default ``width``.
        value_input_size: the value's input width, where it reads other inputs (MobileBERT); default ``H``.
    """
    return (
        nn.Linear(hidden_size, width, bias=bias),
        nn.Linear(hidden_size, kv_width or width, bias=bias),
        nn.Linear(value_input_size or hidden_size, kv_width or width, bias=bias),
    )


class QKVProjections(nn.Module):
    """transformers' ``attention.self`` of the built-in attention kinds: ``query``, ``key``, ``value``
    (:func:`qkv_linears`); a kind adds its own modules beside them (a subclass's ``__init__``)."""

    def __init__(self, hidden_size: int, width: int, bias: bool = True) -> None:
        super().__init__()
        self.query, self.key, self.value = qkv_linears(hidden_size, width, bias)

    def project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[..., H]`` → query, key, value ``[..., width]`` each."""
        return self.query(hidden_states), self.key(hidden_states), self.value(hidden_states)


class AttentionOutput(ResidualOutput):
    """HF's ``BertSelfOutput``: the :class:`~bertblocks.plugins.feedforward.ResidualOutput` of the attention
    sub-layer, ``all_head_size`` wide in: ``norm(dropout(dense(context)) + residual)``, or ``dropout(dense(context))``
    when the layer owns the residual and norm (``norm=None``)."""
