"""MPNet: RoBERTa's embeddings without token types, BERT's post-LN layers under other names, and one
bucketed relative-position bias (T5-style buckets) shared by every layer.

The shared bucket bias is a position scheme of this module, ``mpnet_bucket``: a local stand-in, clearly named,
until the position-block work's ``relative_bucket`` scheme lands; the family then switches to it and only the
key map's model-side name changes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.config import BertConfig
from bertblocks.core.family import Family
from bertblocks.core.interfaces import PositionBias, Positions, PositionScheme
from bertblocks.core.keymap import KeyMap, Rename, Shared

from .bertlike import bert_fields_from_hf, bert_fields_to_hf
from .roberta import LM_HEAD_RULES, roberta_tokenizer

MAX_DISTANCE = 128  # fixed in MPNet's relative_position_bucket
BUCKETS = 32  # MPNet computes buckets with 32 whatever relative_attention_num_buckets says


class BucketOptions(BaseModel):
    """Options of the ``mpnet_bucket`` position scheme."""

    model_config = ConfigDict(extra="forbid")

    num_buckets: PositiveInt = Field(32, description="rows of the shared bias table (relative_attention_num_buckets)")


def relative_position_bucket(relative: torch.Tensor, num_buckets: int = BUCKETS, max_distance: int = MAX_DISTANCE):  # noqa: ANN201
    """MPNet's (T5's bidirectional) bucketing of ``key - query`` distances: exact up to 8, log-spaced to 128."""
    n = -relative
    half = num_buckets // 2
    out = (n < 0).to(torch.long) * half
    n = n.abs()
    exact = half // 2
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).to(torch.long)
    large = torch.minimum(large, torch.full_like(large, half - 1))
    return out + torch.where(n < exact, n, large)


class SharedBucketBias(PositionBias):
    """One ``[num_buckets, heads]`` table whose entries are added to the scaled scores of every layer.

    transformers adds the bias *after* scaling ``QKᵀ``; the attention module scales a position bias with the
    scores, so this returns it divided by the scale.
    """

    def __init__(self, num_buckets: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        self.unscale = math.sqrt(head_dim)

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: Positions) -> torch.Tensor:
        relative = positions.key[None, :] - positions.query[:, None]  # [q, k]
        values = self.relative_attention_bias(relative_position_bucket(relative))  # [q, k, h]
        return values.permute(2, 0, 1)[None].to(query.dtype) * self.unscale  # [1, h, q, k]


class MPNetBucketPositions(PositionScheme):
    """Absolute position table (offset past padding by the embedding) plus one shared bucket bias."""

    name = "mpnet_bucket"
    adds_score_bias = True

    def __init__(self, max_positions: int, num_buckets: int = 32) -> None:
        super().__init__(max_positions)
        self.num_buckets = num_buckets
        self._shared: SharedBucketBias | None = None

    def embedding(self, hidden_size: int) -> nn.Module:
        return nn.Embedding(self.max_positions, hidden_size)

    def attention_bias(self, num_heads: int, head_dim: int) -> PositionBias:
        # the same module for every layer: one table, shared (transformers keeps it on the encoder)
        if self._shared is None:
            self._shared = SharedBucketBias(self.num_buckets, num_heads, head_dim)
        return self._shared


def _positions(*, max_positions: int, options: BucketOptions) -> MPNetBucketPositions:
    return MPNetBucketPositions(max_positions, options.num_buckets)


_L, _O = "mpnet.encoder.layer.{i}", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="mpnet",
    rules=(
        Rename(f"{_L}.attention.attn.q", f"{_O}.attention.self.query"),
        Rename(f"{_L}.attention.attn.k", f"{_O}.attention.self.key"),
        Rename(f"{_L}.attention.attn.v", f"{_O}.attention.self.value"),
        Rename(f"{_L}.attention.attn.o", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.attention.LayerNorm", f"{_O}.attention.output.LayerNorm"),
        Shared(
            "mpnet.encoder.relative_attention_bias",
            f"{_O}.attention.self.distance_embedding.relative_attention_bias",
        ),
        *LM_HEAD_RULES,
    ),
    head_prefixes=("lm_head.", "classifier.", "qa_outputs."),
)


def _from_hf(hf: Any) -> dict[str, Any]:
    src = dict(hf)
    buckets = src.pop("relative_attention_num_buckets", 32)
    src.setdefault("pad_token_id", 1)
    src["type_vocab_size"] = 1  # unused: no token-type table
    data = bert_fields_from_hf(src)
    data["embedding"] = {**data["embedding"], "position_offset": "padding", "token_types": False}
    data["position"] = {"name": "mpnet_bucket", "num_buckets": buckets}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type", "type_vocab_size"))
    out["relative_attention_num_buckets"] = config.position.options().get("num_buckets", 32)
    return out


MPNET = Family(
    model_type="mpnet",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    key_map=KEY_MAP,
    architectures={
        "MPNetForMaskedLM": "masked_lm_gelu",
        "MPNetForSequenceClassification": {"name": "dense_classification", "activation": "tanh"},
        "MPNetForTokenClassification": "token_classification",
        "MPNetForQuestionAnswering": "question_answering",
        "MPNetForMultipleChoice": "multiple_choice",
    },
    base_architecture="MPNetModel",
    fixed={"position.name": "mpnet_bucket", "embedding.position_offset": "padding", "embedding.token_types": False},
    description="MPNet: RoBERTa positions, no token types, one bucketed relative bias shared by all layers",
    tokenizer=roberta_tokenizer("MPNet"),
)


def bertblocks_register_components() -> list[Component]:
    return [
        Component("family", "mpnet", lambda **_: MPNET, description=MPNET.description),
        Component(
            "position",
            "mpnet_bucket",
            _positions,
            BucketOptions,
            "learned absolute table + one bucketed relative bias shared by all layers (MPNet)",
        ),
    ]
