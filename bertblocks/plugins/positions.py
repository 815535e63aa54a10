"""Position schemes: ``absolute`` (BERT's learned table) and the relative schemes of Shaw et al. / Huang et al.

``relative_key`` adds ``q · E[i - j]`` to the score of query ``i`` and key ``j``; ``relative_key_query`` also
adds ``k · E[i - j]``. ``E`` is a learned ``[2 * max_positions - 1, d]`` table per layer, stored at HF's key
``attention.self.distance_embedding.weight``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import PositionBias, Positions, PositionScheme


class AbsolutePositions(PositionScheme):
    """A learned embedding per position, added to the token embeddings (original BERT)."""

    name = "absolute"
    adds_score_bias = False

    def embedding(self, hidden_size: int) -> nn.Module:
        return nn.Embedding(self.max_positions, hidden_size)


class RelativeBias(PositionBias):
    """Per-layer relative-distance table and the score term it produces.

    Shapes::

        query, key [b, h, q|k, d]   weight [2P - 1, d]   → bias [b, h, q, k]

    Instead of materialising HF's ``[q, k, d]`` table of distance embeddings, it multiplies the queries by
    the slice of the table the distances can reach (``[b, h, q, n_dist]``) and gathers each (i, j) entry:
    the same dot products, without the ``q·k·d`` intermediate.
    """

    def __init__(self, max_positions: int, head_dim: int, with_key: bool) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.with_key = with_key
        self.weight = nn.Parameter(torch.empty(2 * max_positions - 1, head_dim))
        nn.init.normal_(self.weight)

    def reset_parameters_like_hf(self, std: float) -> None:
        # HF keeps this table in an nn.Embedding, initialised like every embedding.
        with torch.no_grad():
            self.weight.normal_(0.0, std)

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: Positions) -> torch.Tensor:
        lo, hi = positions.distance_range
        if hi > self.max_positions - 1 or -lo > self.max_positions - 1:
            raise ValueError(
                f"relative distance {max(hi, -lo)} exceeds the table of max_position_embeddings="
                f"{self.max_positions} (sequence plus cache must not be longer than that)"
            )
        table = self.weight[lo + self.max_positions - 1 : hi + self.max_positions].to(query.dtype)  # [n, d]
        index = positions.query[:, None] - positions.key[None, :] - lo  # [q, k] into the slice
        b, h, q, _ = query.shape
        k = key.shape[2]
        scores = torch.gather(query @ table.T, 3, index.expand(b, h, q, k))  # [b, h, q, k]
        if self.with_key:
            by_key = torch.gather(key @ table.T, 3, index.T.expand(b, h, k, q))  # [b, h, k, q]
            scores = scores + by_key.transpose(-1, -2)
        return scores


class RelativeKeyPositions(PositionScheme):
    """``relative_key``: score bias ``q_i · E[i - j]`` (Shaw et al. 2018). No position embedding is added."""

    name = "relative_key"
    adds_score_bias = True
    with_key: ClassVar[bool] = False
    # transformers 4.x creates (and saves) an absolute table even for relative models, unused.
    ignored_checkpoint_keys = ("embeddings.position_embeddings.weight",)

    def attention_bias(self, num_heads: int, head_dim: int) -> PositionBias:
        return RelativeBias(self.max_positions, head_dim, with_key=self.with_key)


class RelativeKeyQueryPositions(RelativeKeyPositions):
    """``relative_key_query``: ``q_i · E[i - j] + k_j · E[i - j]`` (Huang et al. 2020, method 4)."""

    name = "relative_key_query"
    with_key = True


def _factory(cls: type[PositionScheme]):  # noqa: ANN202 - tiny closure
    def make(*, max_positions: int, options: object) -> PositionScheme:
        return cls(max_positions)

    return make


def bertblocks_register_components() -> list[Component]:
    return [
        Component("position", "absolute", _factory(AbsolutePositions), description="learned absolute embeddings"),
        Component("position", "relative_key", _factory(RelativeKeyPositions), description="relative bias q·E[i-j]"),
        Component(
            "position",
            "relative_key_query",
            _factory(RelativeKeyQueryPositions),
            description="relative bias q·E[i-j] + k·E[i-j]",
        ),
    ]
