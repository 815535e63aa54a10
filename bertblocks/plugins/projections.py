"""The projections every built-in attention kind is made of, under transformers' names so checkpoints load unchanged:
``attention.self.{query,key,value}`` (:func:`qkv_linears`, :class:`QKVProjections`) and ``attention.output.{dense,
LayerNorm}`` (:class:`AttentionOutput`); and the forward signature of the encoder-only kinds
(:class:`EncoderOnlyAttention`).

BERT's attention (:mod:`.attention`, which may instead fuse the three into one ``Wqkv``), Longformer's banded
attention (plus its global projections), Nyströmformer's (plus its value convolution), BigBird's block-sparse
attention (plus a rotary module) and ConvBERT's mixed attention (plus its convolutions) all build their query, key,
value and output projections here: one place for their shapes, biases and key names.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

from bertblocks.core.capabilities import CapabilityError
from bertblocks.core.interfaces import Attention, Positions
from bertblocks.core.packing import Packing

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


class EncoderOnlyAttention(Attention):
    """An attention kind of an encoder only (Longformer's, Nyströmformer's, ConvBERT's mixed attention): the
    :class:`~bertblocks.core.interfaces.Attention` forward signature in one place, which refuses cross-attention, a
    KV cache and a causal mask (a :class:`~bertblocks.core.capabilities.CapabilityError` naming :attr:`kind` and the
    declared reason) and hands the rest to :meth:`attend`.

    The declarations (``capabilities``: no cache) keep a decoder config from being built; this refusal covers a
    direct call.
    """

    #: the kind's registry name, for messages (``"longformer"``)
    kind: ClassVar[str]

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        encoder_hidden_states: torch.Tensor | None = None,
        cache: Any = None,
        layer_index: int = 0,
        is_causal: bool = False,
        packing: Packing | None = None,
        **extra_inputs: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if encoder_hidden_states is not None or cache is not None or is_causal:
            raise CapabilityError(
                self.capabilities.refusal(
                    f"the {self.kind} attention is an encoder's: no cross-attention, KV cache or causal mask"
                )
            )
        return self.attend(
            hidden_states,
            mask=mask,
            positions=positions,
            head_mask=head_mask,
            output_attentions=output_attentions,
            packing=packing,
            **extra_inputs,
        )

    @abstractmethod
    def attend(
        self,
        hidden_states: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None,
        output_attentions: bool,
        packing: Packing | None,
        **extra_inputs: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention of an encoder: the arguments of :meth:`forward` that such a layer reads (the model's
        ``extra_inputs`` the kind declares as keywords)."""
