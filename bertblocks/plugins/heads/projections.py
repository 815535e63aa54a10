"""A head's output layer: a linear map onto ``num_labels`` (or 1, 2) outputs is a plain ``nn.Linear``; onto the
vocabulary it is a :class:`TiedLinear`, whose weight may be the token embedding table, and BERT's
:class:`LMPrediction` adds the transform and a bias shared with the decoder under HF's names."""

from __future__ import annotations

import torch
from torch import nn


class TiedLinear(nn.Linear):
    """A vocabulary decoder ``[.., W] → [.., vocab]`` whose weight is the token embedding table when ``tie``.

    Tying happens in :meth:`tie_to`, called by the task model once the head is initialised (never before:
    initialising the head would then re-draw the embeddings through the shared weight).
    """

    def __init__(self, width: int, vocab_size: int, *, tie: bool, bias: bool = True) -> None:
        super().__init__(width, vocab_size, bias=bias)
        self.tie = tie

    def tie_to(self, input_embeddings: nn.Embedding) -> None:
        if self.tie:
            self.weight = input_embeddings.weight


class LMPrediction(nn.Module):
    """HF's ``BertLMPredictionHead``: ``transform``, then ``decoder`` onto the vocabulary with its own ``bias``.

    Tied (``tie_word_embeddings``, the default): the decoder weight *is* the token embedding table and the
    decoder bias *is* ``bias`` (one parameter under two names, as HF), so checkpoints store neither decoder key.
    Untied: the decoder owns its weight and bias, as in transformers 5 (``bias`` is then kept, unused, only so
    that checkpoints keep HF's keys).
    """

    def __init__(self, transform: nn.Module, width: int, vocab_size: int, *, tie: bool) -> None:
        super().__init__()
        self.transform = transform
        self.decoder = TiedLinear(width, vocab_size, tie=tie)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        if tie:
            self.decoder.bias = self.bias

    def tie_to(self, input_embeddings: nn.Embedding) -> None:
        if self.decoder.tie:
            self.decoder.tie_to(input_embeddings)
            self.decoder.bias = self.bias

    def reset_parameters_like_hf(self, std: float) -> None:
        # the bias is this module's own parameter: a checkpoint without an MLM head (a sentence encoder such as
        # MiniLM) loads on the meta device and leaves it for initialisation, zero as in transformers
        with torch.no_grad():
            self.bias.zero_()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))  # [b, q, vocab]
