"""ALiBi position biases (Press et al. 2022): no position embedding; every head adds ``-m_h · |i - j|`` to the
score of query ``i`` and key ``j``, with a fixed slope ``m_h`` per head.

Shapes::

    slopes [h]   distances |i - j| [q, k]   → bias [1, h, q, k] (broadcast over the batch)

Encoders see both directions, so the distance is symmetric; under a causal mask this is the original
(decoder) ALiBi, because keys after the query are masked anyway.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from bertblocks.core.interfaces import (
    HeadProjections,
    ModelDims,
    PackedScoreTerm,
    PositionBias,
    Positions,
    PositionScheme,
)


class AlibiOptions(BaseModel):
    """Options of the ``alibi`` position scheme."""

    model_config = ConfigDict(extra="forbid")

    slopes: Literal["geometric"] | list[PositiveFloat] = Field(
        "geometric",
        description="'geometric' (the paper's 2^(-max_bias·i/h) per head) or one explicit slope per head",
    )
    max_bias: PositiveFloat = Field(8.0, description="steepest geometric slope is 2^(-max_bias/h) … 2^(-max_bias)")


def alibi_slopes(num_heads: int, max_bias: float = 8.0) -> list[float]:
    """The paper's geometric slopes ``2^(-max_bias·i/n)``, ``i = 1..n``.

    For a head count that is not a power of two, the slopes of the closest smaller power of two are
    followed by every other slope of the next power of two, as in the reference implementation (and BLOOM).
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-max_bias * i / closest) for i in range(1, closest + 1)]
    if closest < num_heads:
        extra = [2.0 ** (-max_bias * i / (2 * closest)) for i in range(1, 4 * closest, 2)]
        slopes += extra[: num_heads - closest]
    return slopes


class AlibiBias(PositionBias):
    """One layer's ALiBi term. It has no weights: the slopes are a non-persistent buffer, so checkpoints of an
    ALiBi model hold exactly the same keys as those of any other BERT without a position table."""

    # Registered under this name in the attention module (not HF's `distance_embedding`: nothing to load).
    module_name: ClassVar[str] = "alibi"
    # The term reads only the heads' width and the distances: a packed batch attends sequence by sequence with
    # each one's own term instead of being re-padded.
    per_sequence: ClassVar[bool] = True

    def __init__(self, slopes: list[float]) -> None:
        super().__init__()
        self.register_buffer("slopes", torch.tensor(slopes, dtype=torch.float32), persistent=False)

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: Positions) -> torch.Tensor:
        distance = (positions.query[:, None] - positions.key[None, :]).abs().to(query.dtype)  # [q, k]
        slopes = self.slopes.to(query.dtype)[:, None, None]  # [h, 1, 1]
        # The attention module multiplies every position bias by the softmax scale 1/√d (HF's relative
        # schemes bias QKᵀ before scaling); ALiBi biases the *scaled* scores, so √d is undone here.
        unscale = math.sqrt(query.shape[-1])
        return (-unscale * slopes * distance)[None]  # [1, h, q, k]

    def packed_term(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: Positions,
        projections: HeadProjections | None = None,
    ) -> PackedScoreTerm:
        # Inside a compiled graph every packed sequence reads the top-left corner of the padded batch's term (the
        # term depends on the distances alone): one [1, h, L, L] tensor, no per-sequence size.
        heads = query.transpose(0, 1)[None]  # [1, h, T, d]: forward reads only its width and dtype
        return PackedScoreTerm(fixed=self(heads, heads, positions))


class AlibiPositions(PositionScheme):
    """The ``alibi`` scheme: adds no embedding, gives every self-attention layer an :class:`AlibiBias`."""

    name = "alibi"
    adds_score_bias = True  # declared: the builder checks the backend can take an additive mask

    def __init__(self, max_positions: int, options: AlibiOptions) -> None:
        super().__init__(max_positions)
        self.options = options

    def attention_bias(self, num_heads: int, head_dim: int) -> AlibiBias:
        slopes = self.options.slopes
        if slopes == "geometric":
            return AlibiBias(alibi_slopes(num_heads, self.options.max_bias))
        if len(slopes) != num_heads:
            raise ValueError(f"alibi: slopes lists {len(slopes)} values but the layer has {num_heads} heads")
        return AlibiBias(list(slopes))


def make_alibi(*, max_positions: int, model: ModelDims, options: AlibiOptions) -> AlibiPositions:
    """Factory of the ``alibi`` position component (the model's sizes, ``model``, change nothing here)."""
    return AlibiPositions(max_positions, options)
