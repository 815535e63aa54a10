"""BERT's embeddings: token + token type (+ the position scheme's embedding) → LayerNorm → dropout."""

from __future__ import annotations

import torch
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import Embedding, PositionScheme


class BertEmbeddings(Embedding):
    """HF's ``BertEmbeddings``, with the position table supplied by the position scheme (if it adds one).

    A relative scheme adds nothing here, so no unused ``position_embeddings`` parameter exists (an unused
    parameter breaks DDP; transformers fixed the same in PR #31899).
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        hidden_size: int,
        type_vocab_size: int,
        pad_token_id: int | None,
        layer_norm_eps: float,
        dropout: float,
        position: PositionScheme,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        position_table = position.embedding(hidden_size)
        if position_table is not None:
            self.position_embeddings = position_table
        self.has_position_table = position_table is not None
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)  # CamelCase: HF checkpoint key
        self.dropout = nn.Dropout(dropout)
        # Non-persistent, as in transformers >= 4.31: never written to checkpoints.
        self.register_buffer("position_ids", torch.arange(position.max_positions)[None], persistent=False)
        self.register_buffer(
            "token_type_ids", torch.zeros(1, position.max_positions, dtype=torch.long), persistent=False
        )

    def input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        past_length: int = 0,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            assert input_ids is not None
            inputs_embeds = self.word_embeddings(input_ids)  # [b, q, H]
        b, q = inputs_embeds.shape[:2]
        if token_type_ids is None:
            token_type_ids = self.token_type_ids[:, :q].expand(b, q)
        embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
        if self.has_position_table:
            if position_ids is None:
                position_ids = self.position_ids[:, past_length : past_length + q]
            embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


def build_bert_embeddings(
    *,
    vocab_size: int,
    hidden_size: int,
    type_vocab_size: int,
    pad_token_id: int | None,
    layer_norm_eps: float,
    dropout: float,
    position: PositionScheme,
    options: object,
) -> BertEmbeddings:
    return BertEmbeddings(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        type_vocab_size=type_vocab_size,
        pad_token_id=pad_token_id,
        layer_norm_eps=layer_norm_eps,
        dropout=dropout,
        position=position,
    )


def bertblocks_register_components() -> list[Component]:
    return [Component("embedding", "bert", build_bert_embeddings, description="token + type (+ position) → LN")]
