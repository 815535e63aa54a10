"""Retrieval heads: what an embedding model puts on its backbone to be searched with (scoring functions in
:mod:`bertblocks.sentence`).

* ``splade`` — the masked-LM head's vocabulary logits (BERT's ``cls.predictions``, so a SPLADE checkpoint, a
  ``BertForMaskedLM``, loads unchanged) → ``log(1 + relu(logits))`` → the maximum over the real tokens: one
  vocabulary-sized, mostly-zero vector per sequence, field ``sparse_embedding [b, vocab]``.
* ``colbert`` — ColBERT's ``linear`` (``hidden → dim``, no bias, as the published ColBERT code) on every token,
  L2-normalised, padding zeroed: ``token_embeddings [b, q, dim]`` and ``token_mask [b, q]``.
* ``bge_m3`` — BGE-M3's three outputs from one XLM-RoBERTa backbone, with its published module names
  (``colbert_linear``, ``sparse_linear``) and FlagEmbedding's equations:

  - ``dense_embedding [b, H]`` = ``normalize(h[:, 0])``;
  - ``sparse_embedding [b, vocab]``: per token ``w = relu(sparse_linear(h))`` (``[b, q]``), scattered to its
    token id, the maximum per id over the sequence, the special tokens' ids (``special_token_ids``: XLM-R's
    ``<s>``, ``<pad>``, ``</s>``, ``<unk>``) set to 0; padding (whose id is ``<pad>``'s) counts for nothing;
  - ``colbert_embedding [b, q - 1, H]`` = ``normalize(colbert_linear(h[:, 1:]) · mask[:, 1:])`` and
    ``colbert_mask [b, q - 1]`` (the first token, ``<s>``, has no vector).

None of them has a loss (they are trained with contrastive losses over pairs, outside the model): labels are
refused. ``from_pretrained`` reads their published head files beside the weights (``Head.companion_files``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.core.interfaces import Head
from bertblocks.core.outputs import (
    BGEM3Output,
    ModelOutput,
    ModelOutputWithPooling,
    MultiVectorOutput,
    SparseEmbeddingOutput,
)
from bertblocks.errors import InputError
from bertblocks.plugins.poolers import token_mask

from .bert import lm_prediction  # the masked-LM head's modules, under its checkpoint names
from .composition import Branch, ComposedHead, HeadArguments
from .losses import LossContext
from .transforms import Steps

#: XLM-RoBERTa's ``<s>``, ``<pad>``, ``</s>``, ``<unk>``: the ids BGE-M3's lexical weights leave out
XLMR_SPECIAL_TOKEN_IDS = (0, 1, 2, 3)


class NoLoss:
    """The loss of a head trained outside the model: it takes no labels (the task model refuses any)."""

    label_names: tuple[str, ...] = ()
    config_fields: tuple[str, ...] = ()

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], labels: Mapping[str, torch.Tensor], context: LossContext
    ) -> torch.Tensor:
        raise InputError("this head has no loss; it takes no labels")


class LogSaturation(nn.Module):
    """SPLADE's term weighting ``log(1 + relu(x))``: non-negative, and a large logit grows only logarithmically."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log1p(torch.relu(logits))


# ------------------------------------------------------------------------------------------------ options
class SpladeOptions(BaseModel):
    """Options of ``splade``."""

    model_config = ConfigDict(extra="forbid")

    activation: Literal["hidden_act", "gelu"] = Field(
        "hidden_act",
        description="the MLM transform's activation: the config's hidden_act (BERT's masked_lm) or gelu "
        "(RoBERTa's masked_lm_gelu)",
    )


class ColBERTOptions(BaseModel):
    """Options of ``colbert``: the projection's width, and ColBERT's input convention, which
    :func:`bertblocks.sentence.encode_colbert` applies (the head itself embeds whatever ids it is given).

    ColBERT (Khattab & Zaharia 2020; stanford-futuredata/ColBERT) and PyLate put a marker token after the first
    special token, ``[Q]`` for a query and ``[D]`` for a document (BERT's ``[unused0]``/``[unused1]``; PyLate adds
    ``[Q] ``/``[D] `` to the vocabulary), truncate each to its length (marker and special tokens included) and pad a
    query to ``query_length`` with the mask token (*query augmentation*): those expansion tokens get vectors too and
    take part in the score, but the other tokens do not attend to them unless ``attend_to_expansion_tokens``. A
    document's punctuation tokens are read by the encoder but get no vector (``mask_punctuation``).
    """

    model_config = ConfigDict(extra="forbid")

    dim: PositiveInt = Field(128, description="the width of each token's vector (ColBERT's dim)")
    query_marker: str | None = Field(
        "[unused0]",
        description="the token after a query's first special token (ColBERT's [Q], stored as BERT's [unused0]; "
        "PyLate's '[Q] '); null: none",
    )
    document_marker: str | None = Field(
        "[unused1]",
        description="the token after a document's first special token (ColBERT's [D], BERT's [unused1]; PyLate's "
        "'[D] '); null: none",
    )
    query_length: PositiveInt = Field(
        32, description="tokens per query, special tokens and marker included (ColBERT's query_maxlen)"
    )
    document_length: PositiveInt = Field(
        180, description="the most tokens per document, special tokens and marker included (ColBERT's doc_maxlen)"
    )
    query_augmentation: bool = Field(
        True, description="pad each query to query_length with the mask token (PyLate's do_query_expansion)"
    )
    attend_to_expansion_tokens: bool = Field(
        False,
        description="the query's tokens attend to its mask-token padding too (ColBERT's attend_to_mask_tokens)",
    )
    mask_punctuation: bool = Field(
        True,
        description="a document's punctuation tokens (each character of string.punctuation, tokenized alone) get no "
        "vector (ColBERT's mask_punctuation, PyLate's skiplist_words)",
    )


class BGEM3Options(BaseModel):
    """Options of ``bge_m3``."""

    model_config = ConfigDict(extra="forbid")

    special_token_ids: tuple[int, ...] = Field(
        XLMR_SPECIAL_TOKEN_IDS,
        description="token ids whose lexical weight is 0 (FlagEmbedding's cls, eos, pad and unk ids; "
        "XLM-RoBERTa's by default)",
    )


# ------------------------------------------------------------------------------------------------ heads
def splade(name: str, a: HeadArguments) -> ComposedHead:
    """``max over real tokens of log(1 + relu(cls.predictions(h)))`` → ``sparse_embedding [b, vocab]``."""
    options: SpladeOptions = a.options
    activation = a.activation() if options.activation == "hidden_act" else nn.GELU()
    return ComposedHead(
        name,
        modules={"cls": Steps(("predictions", lm_prediction(a, activation))), "saturation": LogSaturation()},
        branches=(Branch(("sparse_embedding",), "max", ("cls", "saturation"), late=True),),
        loss=NoLoss(),
        output=SparseEmbeddingOutput,
    )


def real_tokens(attention_mask: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """The ``[b, q]`` mask (in ``hidden``'s dtype) of the real positions of ``hidden [b, q, n]``."""
    if attention_mask is None:
        return hidden.new_ones(hidden.shape[:2])
    return token_mask(attention_mask, hidden.shape[1]).to(hidden.dtype)


class ColBERTHead(Head):
    """ColBERT: ``normalize(linear(h)) · mask`` per token (see the module docstring)."""

    label_names = ()

    def __init__(self, hidden_size: int, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, dim, bias=False)  # ColBERT's published layer: no bias

    def forward(
        self,
        output: ModelOutputWithPooling,
        labels: Mapping[str, torch.Tensor],
        batch_shape: tuple[int, ...],
        *,
        attention_mask: torch.Tensor | None,
    ) -> ModelOutput:
        hidden = output.last_hidden_state
        assert hidden is not None
        mask = real_tokens(attention_mask, hidden)  # [b, q]
        vectors = F.normalize(self.linear(hidden), p=2, dim=-1) * mask[..., None]  # [b, q, dim]
        return MultiVectorOutput(token_embeddings=vectors, token_mask=mask.to(torch.long))


class BGEM3Head(Head):
    """BGE-M3's dense, sparse and ColBERT outputs (see the module docstring for the equations)."""

    label_names = ()
    reads_input_ids = True  # the lexical weights are indexed by token id
    # BGE-M3 publishes these two beside model.safetensors, in files of their own
    companion_files = MappingProxyType({"colbert_linear": "colbert_linear", "sparse_linear": "sparse_linear"})

    def __init__(self, hidden_size: int, vocab_size: int, special_token_ids: tuple[int, ...]) -> None:
        super().__init__()
        self.colbert_linear = nn.Linear(hidden_size, hidden_size)  # FlagEmbedding: Linear(hidden, hidden), bias
        self.sparse_linear = nn.Linear(hidden_size, 1)
        self.vocab_size = vocab_size
        self.special_token_ids = tuple(special_token_ids)

    def forward(
        self,
        output: ModelOutputWithPooling,
        labels: Mapping[str, torch.Tensor],
        batch_shape: tuple[int, ...],
        *,
        attention_mask: torch.Tensor | None,
        input_ids: torch.Tensor | None = None,
    ) -> ModelOutput:
        hidden = output.last_hidden_state
        assert hidden is not None
        if input_ids is None:
            raise InputError(
                "the bge_m3 head needs input_ids (its lexical weights are per token id), not inputs_embeds"
            )
        mask = real_tokens(attention_mask, hidden)  # [b, q]
        dense = F.normalize(hidden[:, 0], p=2, dim=-1)  # [b, H]
        weights = torch.relu(self.sparse_linear(hidden)).squeeze(-1) * mask  # [b, q]; padding weighs 0
        sparse = hidden.new_zeros(hidden.shape[0], self.vocab_size)
        sparse = sparse.scatter_reduce(1, input_ids.long(), weights, reduce="amax")  # the max per token id
        keep = torch.ones(self.vocab_size, dtype=sparse.dtype, device=sparse.device)
        keep[[i for i in self.special_token_ids if 0 <= i < self.vocab_size]] = 0
        sparse = sparse * keep  # the special tokens weigh 0 (out of place: the scatter's output stays for backward)
        colbert = self.colbert_linear(hidden[:, 1:]) * mask[:, 1:, None]  # [b, q - 1, H]
        colbert = F.normalize(colbert, p=2, dim=-1)  # zero rows stay zero
        return BGEM3Output(
            dense_embedding=dense,
            sparse_embedding=sparse,
            colbert_embedding=colbert,
            colbert_mask=mask[:, 1:].to(torch.long),
        )


def colbert(name: str, a: HeadArguments) -> Head:
    """ColBERT's per-token projection (:class:`ColBERTHead`)."""
    return ColBERTHead(a.hidden_size, a.options.dim)


def bge_m3(name: str, a: HeadArguments) -> Head:
    """BGE-M3's three outputs (:class:`BGEM3Head`)."""
    return BGEM3Head(a.hidden_size, a.vocab_size, a.options.special_token_ids)
