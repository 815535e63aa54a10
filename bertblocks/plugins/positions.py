"""Position schemes: ``absolute`` (BERT's learned table), the relative schemes of Shaw et al. / Huang et al.,
rotary positions (``rope``), MPNet's bucketed relative bias (``relative_bucket``), symmetric ALiBi
(``symmetric_alibi``, Jina-embeddings-v2's) and ``none``.

``relative_key`` adds ``q · E[i - j]`` to the score of query ``i`` and key ``j``; ``relative_key_query`` also
adds ``k · E[i - j]``. ``E`` is a learned ``[2 * max_positions - 1, d]`` table per layer, stored at HF's key
``attention.self.distance_embedding.weight``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import (
    HeadProjections,
    ModelDims,
    PackedScoreTerm,
    PositionBias,
    Positions,
    PositionScheme,
    Rotary,
    SharedPositionBias,
    SharedPositionTerm,
)

from ..errors import InputError


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

    #: reads only the queries, keys and their positions: a packed sequence's term is this term over it alone
    per_sequence: ClassVar[bool] = True

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

    def _table(self, positions: Positions, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of the table the distances reach ``[n, d]``, and each (query, key) pair's row ``[q, k]``."""
        lo, hi = positions.distance_range
        if hi > self.max_positions - 1 or -lo > self.max_positions - 1:
            raise InputError(
                f"relative distance {max(hi, -lo)} exceeds the table of max_position_embeddings="
                f"{self.max_positions} (sequence plus cache must not be longer than that)"
            )
        table = self.weight[lo + self.max_positions - 1 : hi + self.max_positions].to(dtype)  # [n, d]
        index = positions.query[:, None] - positions.key[None, :] - lo  # [q, k] into the slice
        return table, index

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: Positions) -> torch.Tensor:
        table, index = self._table(positions, query.dtype)
        b, h, q, _ = query.shape
        k = key.shape[2]
        scores = torch.gather(query @ table.T, 3, index.expand(b, h, q, k))  # [b, h, q, k]
        if self.with_key:
            by_key = torch.gather(key @ table.T, 3, index.T.expand(b, h, k, q))  # [b, h, k, q]
            scores = scores + by_key.transpose(-1, -2)
        return scores

    def packed_term(
        self,
        query: torch.Tensor,  # [T, h, d]
        key: torch.Tensor,
        positions: Positions,
        projections: HeadProjections | None = None,
    ) -> PackedScoreTerm:
        """``q · E`` (and ``k · E``) for every packed token ``[T, h, n]``, gathered per pair by the padded index: the
        padded batch's slice of the table covers every distance of its rows."""
        table, index = self._table(positions, query.dtype)
        return PackedScoreTerm(index=index, rows=query @ table.T, cols=key @ table.T if self.with_key else None)


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


class NoPositions(PositionScheme):
    """``none``: no position information at all (a bag of tokens, or an ablation baseline)."""

    name = "none"
    adds_score_bias = False


# ------------------------------------------------------------------------------------------------- rotary
class RopeOptions(BaseModel):
    """Options of the ``rope`` position scheme."""

    model_config = ConfigDict(extra="forbid")

    base: float = Field(10000.0, gt=1.0, description="θ of RoPE: frequency i is base^(-2i/rotary_dim)")
    rotary_dim: PositiveInt | None = Field(
        None, description="head dimensions rotated (from the first; even); null = all, or see rotary_fraction"
    )
    rotary_fraction: float | None = Field(
        None, gt=0.0, le=1.0, description="share of each head rotated (partial rotary), instead of rotary_dim"
    )
    interleaved: bool = Field(
        False,
        description="rotate pairs (2i, 2i+1) as RoFormer does; false: halves (i, i + rotary_dim/2) as GPT-NeoX, "
        "ModernBERT and transformers' rotate_half",
    )
    ntk_factor: float = Field(
        1.0,
        ge=1.0,
        description="fixed NTK-aware scaling by this factor k (GTE's rope_scaling type ntk): frequency i is "
        "(base·k)^(-2i/rotary_dim) / k^(2/rotary_dim); 1 = none",
    )
    table: Literal["computed", "sinusoidal", "inv_freq"] = Field(
        "computed",
        description="computed: sin/cos from base each pass; sinusoidal: RoFormer's fixed table, a frozen weight "
        "encoder.embed_positions.weight [max_positions, rotary_dim] (sines, then cosines, computed in float64) "
        "that checkpoints carry and the rotation reads; inv_freq: ESM's stored inverse frequencies, a buffer "
        "encoder.rotary_embeddings.inv_freq [rotary_dim/2] that checkpoints carry and the rotation reads",
    )
    rotate_value: bool = Field(False, description="rotate the values too (RoFormer's rotary_value)")

    @model_validator(mode="after")
    def _one_width(self) -> RopeOptions:
        if self.rotary_dim is not None and self.rotary_fraction is not None:
            raise InputError("give rotary_dim or rotary_fraction, not both")
        if self.table == "sinusoidal" and self.base != 10000.0:
            raise InputError(f"table: sinusoidal is RoFormer's table of base 10000; base {self.base:g} needs computed")
        if self.table != "computed" and self.ntk_factor != 1.0:
            # a stored table holds its own frequencies: scaling them again would not be what the checkpoint has
            raise InputError(
                f"ntk_factor {self.ntk_factor:g} needs table: computed (a stored {self.table} table is used as stored)"
            )
        return self

    def width(self, head_dim: int) -> int:
        """Rotated dimensions per head of ``head_dim``."""
        if self.rotary_dim is not None:
            return self.rotary_dim
        if self.rotary_fraction is not None:
            return int(head_dim * self.rotary_fraction)
        return head_dim


class RotaryEmbedding(Rotary):
    """RoPE (Su et al. 2021): the pair ``(x_a, x_b)`` of dimension pair ``i`` at position ``p`` becomes
    ``(x_a cos pθ_i - x_b sin pθ_i, x_b cos pθ_i + x_a sin pθ_i)`` with ``θ_i = base^(-2i/r)``, ``r`` the rotated
    width. Scores then depend on positions only through ``p_query - p_key``.

    Pairs are ``(2i, 2i+1)`` (``interleaved``, RoFormer) or ``(i, i + r/2)`` (transformers' ``rotate_half``).
    With fixed NTK-aware scaling by ``k`` (``ntk_factor``, GTE's ``rope_scaling: {type: ntk}``) the frequencies
    are ``θ_i = (base·k)^(-2i/r) / k^(2/r)``: every one lowered, the lowest by ``k``. The tables are computed in
    float32 as transformers does (float64 for float64 inputs) and shared by every layer of one forward pass with
    the same base and width.
    """

    def __init__(
        self,
        rotary_dim: int,
        base: float,
        interleaved: bool,
        *,
        ntk_factor: float = 1.0,
        table: SinusoidalTable | InverseFrequencies | None = None,
        rotate_value: bool = False,
    ) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.base = base
        self.interleaved = interleaved
        self.ntk_factor = ntk_factor
        self.rotates_value = rotate_value
        # the encoder owns the stored table (one tensor for every layer, one checkpoint key); a tuple keeps it from
        # being registered here as well
        self._table = (table,) if table is not None else ()

    def extra_repr(self) -> str:
        ntk = f", ntk_factor={self.ntk_factor:g}" if self.ntk_factor != 1.0 else ""
        stored = f", table={self._table[0].module_name}" if self._table else ""
        return f"rotary_dim={self.rotary_dim}, base={self.base:g}, interleaved={self.interleaved}{ntk}{stored}"

    def _tables(
        self, positions: torch.Tensor, dtype: torch.dtype, memo: dict[Any, Any] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [B|1, t, 1, r]`` for ``positions [B|1, t]``, laid out for this pairing."""
        key = ("rope", self.rotary_dim, self.base, self.interleaved, self.ntk_factor, bool(self._table), dtype)
        if memo is not None and key in memo and memo[key][0] is positions:
            return memo[key][1]
        if self._table:
            cos, sin = self._table[0].cos_sin(positions)  # [B, t, r/2] each
        else:
            compute = torch.float64 if dtype == torch.float64 else torch.float32
            exponent = torch.arange(0, self.rotary_dim, 2, device=positions.device, dtype=torch.int64).to(compute)
            if self.ntk_factor == 1.0:
                inv_freq = 1.0 / (self.base ** (exponent / self.rotary_dim))  # [r/2], transformers' formula
            else:  # fixed NTK-aware scaling: a larger base, and every frequency divided by k^(2/r)
                k = self.ntk_factor
                inv_freq = 1.0 / ((self.base * k) ** (exponent / self.rotary_dim)) / k ** (2.0 / self.rotary_dim)
            angles = positions.to(compute)[..., None] * inv_freq  # [B, t, r/2]
            cos, sin = angles.cos(), angles.sin()
        if self.interleaved:
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        else:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        tables = (cos.to(dtype)[:, :, None, :], sin.to(dtype)[:, :, None, :])  # [B, t, 1, r]
        if memo is not None:
            memo[key] = (positions, tables)  # valid for this positions tensor only
        return tables

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.rotary_dim
        part, rest = (x, None) if r == x.shape[-1] else (x[..., :r], x[..., r:])
        if self.interleaved:
            pairs = part.unflatten(-1, (-1, 2))  # [..., r/2, 2]
            turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        else:
            half = r // 2
            turned = torch.cat((-part[..., half:], part[..., :half]), dim=-1)
        rotated = part * cos + turned * sin
        return rotated if rest is None else torch.cat((rotated, rest), dim=-1)

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, memo: dict[Any, Any] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._tables(positions, query.dtype, memo)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def rotate_value(
        self, value: torch.Tensor, positions: torch.Tensor, memo: dict[Any, Any] | None = None
    ) -> torch.Tensor:
        """``value [B, t, h, d]`` rotated as the keys are (RoFormer's ``rotary_value``)."""
        cos, sin = self._tables(positions, value.dtype, memo)
        return self._rotate(value, cos, sin)


@dataclass(frozen=True)
class StoredRotaryTable:
    """What a stored rope table hands the layers each pass: RoFormer's ``[max_positions, r]`` weight or ESM's
    ``[r/2]`` inverse frequencies."""

    weight: torch.Tensor


def sinusoidal_table(max_positions: int, width: int) -> torch.Tensor:
    """RoFormer's ``create_weight``: angle ``p / 10000^(2i/width)`` of pair ``i`` at position ``p``, computed in
    float64; the sines of the ``width/2`` pairs, then their cosines, as float32 ``[max_positions, width]``."""
    position = torch.arange(max_positions, dtype=torch.float64)[:, None]
    inv_freq = 1.0 / torch.pow(10000.0, torch.arange(0, width, 2, dtype=torch.float64) / width)  # [width/2]
    angles = position * inv_freq
    return torch.cat((angles.sin(), angles.cos()), dim=-1).float()


class SinusoidalTable(SharedPositionTerm):
    """RoFormer's fixed sinusoidal table, kept where its checkpoint has it (``encoder.embed_positions.weight``,
    frozen as transformers' is) and read by every layer's rotation (``rope`` with ``table: sinusoidal``).

    The checkpoint's values are the ones used (transformers loads them too); a model built without a checkpoint
    starts from :func:`sinusoidal_table`.
    """

    module_name = "embed_positions"
    produces = StoredRotaryTable

    def __init__(self, max_positions: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(sinusoidal_table(max_positions, width), requires_grad=False)

    def reset_parameters_like_hf(self, std: float) -> None:
        with torch.no_grad():
            self.weight.copy_(sinusoidal_table(*self.weight.shape))

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [B, t, r/2]`` at ``positions [B, t]``: the halves of the stored rows."""
        sin, cos = self.weight[positions].chunk(2, dim=-1)
        return cos, sin

    def forward(self, positions: Positions, dtype: torch.dtype) -> StoredRotaryTable:
        return StoredRotaryTable(self.weight)


class InverseFrequencies(SharedPositionTerm):
    """ESM's stored inverse frequencies ``1 / base^(2i/r)`` (``encoder.rotary_embeddings.inv_freq [r/2]``, a
    persistent buffer as transformers' is), read by every layer's rotation (``rope`` with ``table: inv_freq``).

    The checkpoint's values are used, as transformers uses them (an old checkpoint may hold them rounded to
    float16); the angles are computed in float32 from them, as ESM does.
    """

    module_name = "rotary_embeddings"
    produces = StoredRotaryTable

    def __init__(self, width: int, base: float) -> None:
        super().__init__()
        exponent = torch.arange(0, width, 2, dtype=torch.float) / width
        self.register_buffer("inv_freq", 1.0 / (base**exponent))  # transformers' float32 formula

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [B, t, r/2]`` at ``positions [B, t]``, the angles in float32."""
        angles = positions.float()[..., None] * self.inv_freq.float()
        return angles.cos(), angles.sin()

    def forward(self, positions: Positions, dtype: torch.dtype) -> StoredRotaryTable:
        return StoredRotaryTable(self.inv_freq)


class RopePositions(PositionScheme):
    """``rope``: rotary position embedding in every self-attention layer; nothing added to the embeddings."""

    name = "rope"
    adds_score_bias = False

    def __init__(self, max_positions: int, options: RopeOptions) -> None:
        super().__init__(max_positions)
        self.options = options
        self.table: SinusoidalTable | InverseFrequencies | None = None
        self.table_width = 0

    def shared_terms(self, model: ModelDims) -> list[SharedPositionTerm]:
        if self.options.table == "computed":
            return []
        width = self.options.width(model.hidden_size // model.num_heads)
        self.table_width = width
        if self.options.table == "sinusoidal":
            self.table = SinusoidalTable(self.max_positions, width)
        else:
            self.table = InverseFrequencies(width, self.options.base)
        return [self.table]

    def rotary(self, num_heads: int, head_dim: int) -> RotaryEmbedding:
        width = self.options.width(head_dim)
        if self.options.table != "computed" and (self.table is None or self.table_width != width):
            # a per-layer scheme (an override) has no table of its own: the encoder holds the one stored
            raise InputError(
                f"rope with table: {self.options.table} keeps one table for the whole model; a layer cannot "
                "override the position scheme or its head width"
            )
        return RotaryEmbedding(
            width,
            self.options.base,
            self.options.interleaved,
            ntk_factor=self.options.ntk_factor,
            table=self.table,
            rotate_value=self.options.rotate_value,
        )

    def problems(self, num_heads: int, head_dim: int) -> list[str]:
        width = self.options.width(head_dim)
        if head_dim % 2:
            return [
                f"rope rotates pairs of dimensions, but the head dimension {head_dim} is odd "
                f"(hidden_size / num_heads); choose num_heads so that it is even"
            ]
        if width > head_dim:
            return [f"rotary_dim {width} is larger than the head dimension {head_dim} (hidden_size / num_heads)"]
        if width % 2 or width == 0:
            return [
                f"rope rotates pairs of dimensions: the rotated width {width} of the {head_dim}-dimensional "
                "heads must be even and positive (rotary_dim / rotary_fraction)"
            ]
        return []


# ------------------------------------------------------------------------------------ MPNet relative buckets
class RelativeBucketOptions(BaseModel):
    """Options of the ``relative_bucket`` position scheme (MPNet's, after T5)."""

    model_config = ConfigDict(extra="forbid")

    num_buckets: PositiveInt = Field(32, description="buckets of relative distance (HF relative_attention_num_buckets)")
    max_distance: PositiveInt = Field(128, description="distances from here on share the last bucket of each sign")
    absolute: bool = Field(
        False, description="also add a learned absolute position table to the embeddings (MPNet has both)"
    )
    table_size: PositiveInt | None = Field(
        None,
        description="rows of the learned table; null = num_buckets. transformers' MPNet sizes its table by "
        "relative_attention_num_buckets but always computes 32 buckets",
    )


def relative_position_bucket(
    relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """transformers' ``MPNetEncoder.relative_position_bucket`` (T5's bidirectional buckets) for ``key - query``.

    Half of the buckets per sign; of those, the first half hold distances exactly, the rest grow
    logarithmically up to ``max_distance``.
    """
    n = -relative_position
    num_buckets //= 2
    ret = (n < 0).to(torch.long) * num_buckets
    n = torch.abs(n)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    return ret + torch.where(is_small, n, val_if_large)


class BucketBias(SharedPositionBias):
    """A learned ``[num_buckets, h]`` table (HF key ``encoder.relative_attention_bias.weight``, an
    ``nn.Embedding`` there) read at each (query, key) distance bucket: ``[1, h, q, k]``."""

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int, table_size: int | None = None) -> None:
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.empty(table_size or num_buckets, num_heads))
        nn.init.normal_(self.weight)

    def reset_parameters_like_hf(self, std: float) -> None:
        with torch.no_grad():
            self.weight.normal_(0.0, std)

    def forward(self, positions: Positions, dtype: torch.dtype) -> torch.Tensor:
        relative = positions.key[None, :] - positions.query[:, None]  # [q, k], MPNet's memory - context
        buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance)
        return self.weight.to(dtype)[buckets].permute(2, 0, 1)[None]  # [1, h, q, k]


class RelativeBucketPositions(PositionScheme):
    """``relative_bucket``: MPNet's relative bias, one table shared by every layer, added to the scaled scores.

    With ``absolute: true`` it also adds a learned absolute table to the embeddings, as MPNet does.
    """

    name = "relative_bucket"
    adds_score_bias = False  # no per-layer bias: its one shared bias comes from shared_bias()

    def __init__(self, max_positions: int, options: RelativeBucketOptions) -> None:
        super().__init__(max_positions)
        self.options = options

    def embedding(self, hidden_size: int) -> nn.Module | None:
        return nn.Embedding(self.max_positions, hidden_size) if self.options.absolute else None

    def shared_bias(self, num_heads: int) -> BucketBias:
        options = self.options
        return BucketBias(num_heads, options.num_buckets, options.max_distance, options.table_size)

    def problems(self, num_heads: int, head_dim: int) -> list[str]:
        if self.options.num_buckets < 4:
            return [f"num_buckets {self.options.num_buckets} is too small: at least 4 (2 per sign, 1 exact)"]
        if self.options.table_size is not None and self.options.table_size < self.options.num_buckets:
            return [
                f"table_size {self.options.table_size} is smaller than num_buckets {self.options.num_buckets}: "
                "every bucket needs a row"
            ]
        return []


# ------------------------------------------------------------------------------------------ symmetric ALiBi
class AlibiOptions(BaseModel):
    """Options of the ``symmetric_alibi`` position scheme."""

    model_config = ConfigDict(extra="forbid")

    slopes: Literal["geometric"] | list[PositiveFloat] = Field(
        "geometric",
        description="'geometric': the ALiBi paper's slopes for the layer's head count (see max_bias); or one "
        "explicit slope per head",
    )
    max_bias: PositiveFloat = Field(
        8.0, description="geometric slopes of n heads (n a power of two) are 2^(-max_bias·i/n), i = 1..n"
    )


def alibi_slopes(num_heads: int, max_bias: float = 8.0) -> list[float]:
    """The ALiBi paper's per-head slopes (Press et al. 2022).

    For ``n`` a power of two: ``2^(-max_bias·i/n)``, ``i = 1..n`` (a geometric sequence starting at its own
    ratio). Otherwise the paper's workaround: the slopes of the largest power of two ``c < n``, then every
    other slope of ``2c`` heads (its 1st, 3rd, 5th, …) until there are ``n``.

    Raises:
        ValueError: ``num_heads`` is not positive.
    """
    if num_heads < 1:
        raise InputError(f"ALiBi needs a positive number of heads, got {num_heads}")
    closest = 2 ** (num_heads.bit_length() - 1)  # largest power of two <= num_heads, exactly (no log2 rounding)
    slopes = [2.0 ** (-max_bias * i / closest) for i in range(1, closest + 1)]
    odd = [2.0 ** (-max_bias * i / (2 * closest)) for i in range(1, 2 * closest, 2)]  # 2c heads' 1st, 3rd, …
    return slopes + odd[: num_heads - closest]


class AlibiBias(SharedPositionBias):
    """``-m_h · |i - j|`` for query ``i``, key ``j`` and head ``h``: one ``[1, h, q, k]`` term per forward pass,
    added to the *scaled* scores of every self-attention layer (as Jina-embeddings-v2 adds its ALiBi tensor).

    The slopes are a non-persistent buffer: an ALiBi model's checkpoint holds no position key at all.
    Distances come from :class:`Positions` (``query``/``key``: cache offset included), so a chunk after a KV
    cache gets exactly the rows of the whole sequence's bias. Like transformers' relative schemes, it ignores
    user ``position_ids``.
    """

    module_name: ClassVar[str] = "alibi"

    def __init__(self, slopes: list[float]) -> None:
        super().__init__()
        # float64: the bias is computed in the activations' dtype from exact-as-possible slopes
        self.register_buffer("slopes", torch.tensor(slopes, dtype=torch.float64), persistent=False)

    def extra_repr(self) -> str:
        return f"heads={self.slopes.numel()}"

    def forward(self, positions: Positions, dtype: torch.dtype) -> torch.Tensor:
        distance = (positions.query[:, None] - positions.key[None, :]).abs()  # [q, k] int64
        # in the activations' dtype (float32: the float32 slope times an exact integer distance, one rounding)
        slopes = self.slopes.to(dtype)[:, None, None]  # [h, 1, 1]
        return (-slopes * distance.to(dtype))[None]  # [1, h, q, k]


class AlibiPositions(PositionScheme):
    """``symmetric_alibi``: no position embedding; every self-attention layer adds ``-m_h · |i - j|`` to its
    scaled scores (ALiBi, Press et al. 2022, with the distance made symmetric for a bidirectional encoder, as
    Jina-embeddings-v2 and MosaicBERT do). Under a causal mask it is the paper's decoder ALiBi (later keys are
    masked anyway).

    Sequences of any length work (nothing is learned per position): ``max_position_embeddings`` does not limit
    them.
    """

    name = "symmetric_alibi"
    adds_score_bias = False  # no per-layer bias: its one shared bias comes from shared_bias()
    limits_length = False

    def __init__(self, max_positions: int, options: AlibiOptions) -> None:
        super().__init__(max_positions)
        self.options = options

    def shared_bias(self, num_heads: int) -> AlibiBias:
        slopes = self.options.slopes
        if slopes == "geometric":
            return AlibiBias(alibi_slopes(num_heads, self.options.max_bias))
        if len(slopes) != num_heads:
            raise InputError(f"symmetric_alibi: slopes lists {len(slopes)} values but the model has {num_heads} heads")
        return AlibiBias(list(slopes))

    def problems(self, num_heads: int, head_dim: int) -> list[str]:
        slopes = self.options.slopes
        if slopes != "geometric" and len(slopes) != num_heads:
            return [f"slopes lists {len(slopes)} values, one per head, but the layer has {num_heads} heads"]
        return []


def _factory(cls: type[PositionScheme]):  # noqa: ANN202 - tiny closure
    def make(*, max_positions: int, model: ModelDims, options: object) -> PositionScheme:
        return cls(max_positions)

    return make


def _with_options(cls: Any):  # noqa: ANN202 - tiny closure
    def make(*, max_positions: int, model: ModelDims, options: Any) -> PositionScheme:
        return cls(max_positions, options)

    return make


def bertblocks_register_components() -> list[Component]:
    return [
        Component("position", "none", _factory(NoPositions), description="no position information"),
        Component(
            "position",
            "rope",
            _with_options(RopePositions),
            RopeOptions,
            description="rotary positions (RoPE): queries and keys rotated in every layer",
        ),
        Component(
            "position",
            "relative_bucket",
            _with_options(RelativeBucketPositions),
            RelativeBucketOptions,
            description="MPNet's bucketed relative bias, shared by all layers",
        ),
        Component(
            "position",
            "symmetric_alibi",
            _with_options(AlibiPositions),
            AlibiOptions,
            description="ALiBi, bidirectional: -slope_h·|i-j| on every layer's scores (Jina-embeddings-v2)",
        ),
        Component("position", "absolute", _factory(AbsolutePositions), description="learned absolute embeddings"),
        Component("position", "relative_key", _factory(RelativeKeyPositions), description="relative bias q·E[i-j]"),
        Component(
            "position",
            "relative_key_query",
            _factory(RelativeKeyQueryPositions),
            description="relative bias q·E[i-j] + k·E[i-j]",
        ),
    ]
