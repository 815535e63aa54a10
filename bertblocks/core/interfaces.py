"""The interfaces every component implements.

A BERT layer stack is assembled from these pieces; the concrete classes come from plugins (built-in or
third-party) through the registry. Nothing here knows any concrete plugin.

Shape notation used throughout::

    b  batch            h  attention heads        d  head dim (hidden // heads)
    q  query positions  k  key positions (cached + new)   H  hidden size
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch
from torch import nn

from ..errors import InputError, UnsupportedError
from .capabilities import AttentionCapabilities
from .outputs import ModelOutput, ModelOutputWithPooling

if TYPE_CHECKING:
    from ..config import BertConfig
    from .cache import KVCache
    from .packing import Packing

T = TypeVar("T")


@dataclass(frozen=True)
class Positions:
    """Token positions of one forward pass, built once by the encoder and handed to every layer.

    Two views of the same facts:

    * ``query [q]`` / ``key [k]`` / ``distance_range``: the positions shared by every row of the batch,
      ``past_length + arange(q)`` for the queries and ``arange(past_length + q)`` for the keys (cached ones
      included). Relative score biases use these, as transformers does (it ignores ``position_ids`` there).
    * :meth:`tokens`: the position of every token of this call, ``[b|1, q]``: the user's ``position_ids`` when
      given, else ``query``. In a packed batch (see :mod:`bertblocks.core.packing`), :meth:`tokens` with
      ``packed=True`` gives ``[1, T]``: each sequence's positions, restarting at 0 for every sequence. Rotary
      schemes rotate queries and new keys by these.

    Attributes:
        query: ``[q]`` int64.
        key: ``[k]`` int64.
        distance_range: smallest and largest ``query - key`` distance, as Python ints, so that relative
            schemes can slice their tables without a device sync.
        ids: ``[b|1, q]`` per-token positions: the user's ``position_ids``, else ``query[None]``
            (:meth:`contiguous` fills it; ``None`` means ``query``).
        packed_ids: ``[1, T]`` per-token positions of the packed real tokens, set when the batch is packed.
        score_bias: ``[b|1, h, q, k]`` a term the position scheme computed once for all layers (a shared
            relative bias), added to the *scaled* scores of every self-attention layer; ``h`` counts the heads
            as built (before pruning).
        memo: per-forward cache for values every layer would otherwise recompute (rotary cos/sin tables).
        shared: what the scheme's :class:`SharedPositionTerm` modules computed once for this pass, by the type
            each declares (:attr:`SharedPositionTerm.produces`); read it with :meth:`term`.
    """

    query: torch.Tensor  # [q] int64
    key: torch.Tensor  # [k] int64
    distance_range: tuple[int, int]
    ids: torch.Tensor | None = None
    packed_ids: torch.Tensor | None = None
    score_bias: torch.Tensor | None = None
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    shared: Mapping[type, Any] = field(default_factory=dict, compare=False, repr=False)

    def term(self, kind: type[T]) -> T | None:
        """The value of type ``kind`` a shared position term computed for this pass, or ``None``."""
        value = self.shared.get(kind)
        return value if value is None or isinstance(value, kind) else None

    @classmethod
    def contiguous(
        cls, query_length: int, past_length: int, device: torch.device, ids: torch.Tensor | None = None
    ) -> Positions:
        """Queries at ``past_length + arange(q)``, keys at ``arange(past_length + q)``; ``ids [b|1, q]``: the
        user's ``position_ids`` (rotary schemes use them)."""
        key = torch.arange(past_length + query_length, device=device)
        query = key[past_length:]
        return cls(
            query=query,
            key=key,
            distance_range=(1 - query_length, past_length + query_length - 1),
            # one tensor for every layer, so that tables computed from it can be shared (see ``memo``)
            ids=ids if ids is not None else query[None],
        )

    @property
    def past_length(self) -> int:
        """Cached positions before this call's tokens."""
        return self.key.shape[0] - self.query.shape[0]

    def tokens(self, packed: bool = False) -> torch.Tensor:
        """Positions of this call's tokens: ``[b|1, q]``, or ``[1, T]`` with ``packed=True``."""
        if packed:
            if self.packed_ids is None:
                raise InputError("tokens(packed=True) asked of positions built for a batch that is not packed")
            return self.packed_ids
        return self.ids if self.ids is not None else self.query[None]

    def prefix(self, length: int) -> Positions:
        """The positions of a lone sequence of ``length`` tokens at ``0 … length - 1`` (no cache): what a score term
        computed for one packed sequence sees (see :meth:`PositionBias.sequence_terms`). Only the query and key
        positions and their distance range are kept; per-token ids, the shared bias and shared terms are not."""
        return Positions(
            query=self.key[:length], key=self.key[:length], distance_range=(1 - length, length - 1), ids=None
        )

    def packed(self, packing: Packing) -> Positions:
        """These positions plus ``packed_ids`` for ``packing`` (each sequence's own positions, from 0)."""
        ids = self.tokens().expand(packing.batch, packing.length)
        return replace(self, packed_ids=packing.pack(ids)[None], memo={})


# ------------------------------------------------------------------------------------------- extra inputs
@dataclass(frozen=True)
class ExtraInput:
    """What a model input beyond BERT's looks like, for whoever must describe it without running the model (an
    exported graph's inputs and their dynamic axes, the dataset columns transformers' Trainer keeps).

    A component that declares ``extra_inputs`` (:attr:`Embedding.extra_inputs`, :attr:`Attention.extra_inputs`,
    ``FeedForwardOutput.extra_inputs``) describes each in its ``extra_input_specs()``; the default there is a per-token
    integer ``[batch, sequence]`` input with zeros as its example.

    Attributes:
        name: the keyword argument (``bbox``, ``lang_ids``, ``global_attention_mask``).
        axes: one entry per dimension: ``"batch"`` or ``"sequence"`` (dynamic in an export, shared with
            ``input_ids``), or a fixed size (``4``: a box's corners).
        dtype: the dtype an exported graph takes it in.
        example: ``(batch, length) -> tensor`` a valid value for a batch of that shape (what an export traces
            with); ``None``: zeros.
    """

    name: str
    axes: tuple[str | int, ...] = ("batch", "sequence")
    dtype: torch.dtype = torch.long
    example: Callable[[int, int], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        for axis in self.axes:
            if isinstance(axis, str) and axis not in ("batch", "sequence"):
                raise InputError(f"extra input {self.name!r}: axis {axis!r} is not 'batch', 'sequence' or a size")

    def example_value(self, batch: int, length: int) -> torch.Tensor:
        """A valid ``[batch, length, …]``-shaped value (the component's :attr:`example`, else zeros)."""
        if self.example is not None:
            return self.example(batch, length).to(self.dtype)
        sizes = {"batch": batch, "sequence": length}
        return torch.zeros([sizes[a] if isinstance(a, str) else a for a in self.axes], dtype=self.dtype)


def default_extra_input_specs(names: tuple[str, ...]) -> tuple[ExtraInput, ...]:
    """The specs of components that describe none of their ``extra_inputs``: per-token integer ``[batch, sequence]``."""
    return tuple(ExtraInput(name) for name in names)


# --------------------------------------------------------------------------------------------- embeddings
class Embedding(nn.Module, ABC):
    """Token (+ token type, + position where the scheme is additive) embeddings → LayerNorm → dropout."""

    #: the backbone passes the caller's ``attention_mask`` (``[b, k]``, ``[b, q, k]`` or ``None``, unchecked) as the
    #: keyword ``attention_mask`` (ESM zeroes padded embeddings and rescales by the share of masked tokens)
    reads_attention_mask: ClassVar[bool] = False
    #: keyword inputs beyond BERT's that this embedding reads (LayoutLM's ``bbox`` ``[b, q, 4]``): the backbone
    #: takes them as keywords (a task model passes them on), checks each through :meth:`check_extra_inputs` and
    #: hands the given ones to :meth:`forward` as keywords; one this tuple does not name is refused. Per token, so
    #: that they enter before packing and a packed batch carries them with its tokens. An instance may set its own
    #: (an option that adds a table adds its input).
    extra_inputs: tuple[str, ...] = ()

    def extra_input_specs(self) -> tuple[ExtraInput, ...]:
        """How each of :attr:`extra_inputs` looks (shape, dtype, an example): what an export makes graph inputs
        of. Default: per-token integer ``[batch, sequence]``; override for any other."""
        return default_extra_input_specs(self.extra_inputs)

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        past_length: int = 0,
    ) -> torch.Tensor:
        """Return ``[b, q, H]`` embeddings. Exactly one of ``input_ids`` / ``inputs_embeds`` is given; each name of
        :attr:`extra_inputs` the caller gave arrives as a keyword, checked."""

    def check_extra_inputs(self, inputs: Mapping[str, torch.Tensor], batch: int, length: int) -> None:
        """Check the given :attr:`extra_inputs` (``None`` values left out) against the batch ``[batch, length]``
        before any is used; raise :class:`~bertblocks.errors.InputError` (or ``InputTypeError``) naming the input
        and what was expected. Data-dependent checks (ranges) are skipped under ``torch.compile``, as the
        backbone's own are. The default accepts what :attr:`extra_inputs` names."""

    @abstractmethod
    def input_embeddings(self) -> nn.Embedding:
        """The token embedding table (what a masked-LM decoder ties its weight to)."""


# ---------------------------------------------------------------------------------------------- positions
@dataclass(frozen=True)
class ModelDims:
    """The model-wide sizes a position scheme may need beyond ``max_positions`` (a shared table as wide as the
    hidden states, with its own LayerNorm): what every position factory gets as ``model``.

    Attributes:
        hidden_size: ``H``.
        num_heads: heads of the model-wide attention spec (per-layer overrides may differ).
        num_layers: layers the stack runs.
        layer_norm_eps: the config's LayerNorm epsilon.
        hidden_dropout: ``hidden_dropout_prob``.
        max_positions: ``max_position_embeddings``.
    """

    hidden_size: int
    num_heads: int
    num_layers: int
    layer_norm_eps: float
    hidden_dropout: float
    max_positions: int


class HeadProjections(Protocol):
    """A self-attention layer's own query and key projections, as a :class:`PositionBias` that declares
    ``reads_projections`` receives them: ``[..., H]`` → ``[..., h·d]`` (biases included, pruned heads gone)."""

    def project_query(self, hidden_states: torch.Tensor) -> torch.Tensor: ...

    def project_key(self, hidden_states: torch.Tensor) -> torch.Tensor: ...


class PositionBias(nn.Module, ABC):
    """A per-layer additive term on the attention scores (relative position schemes).

    The attention module registers it under :attr:`module_name` so that its weight lands at HF's
    checkpoint key (``attention.self.distance_embedding.weight``).

    Two declarations let a term go beyond a bias read from the projected heads (DeBERTa's disentangled
    attention):

    * :attr:`reads_projections`: the attention passes its own projections as ``projections=``
      (:class:`HeadProjections`), so the term can project a position table with the layer's query and key
      weights instead of holding copies;
    * :attr:`score_scale_factor`: the attention's softmax scale becomes ``1/√(d · factor)`` (DeBERTa divides by
      ``√(3d)`` with both c2p and p2c terms); the term is still returned unscaled.
    """

    module_name: ClassVar[str] = "distance_embedding"
    #: the attention passes ``projections=`` (its query and key projections) to :meth:`forward`
    reads_projections: ClassVar[bool] = False
    #: the attention scales scores by ``1/√(head_dim · score_scale_factor)``
    score_scale_factor: float = 1.0
    #: declared: entry ``(i, j)`` of :meth:`forward`'s term depends only on query ``i``, key ``j``, the query and
    #: key positions and ``positions.distance_range`` (no ``positions.ids``, shared terms or mixing across
    #: entries), so the term of one packed sequence is :meth:`forward` over that sequence alone. A packed batch
    #: then attends sequence by sequence with its own ``[h, l, l]`` term (:meth:`sequence_terms`) instead of
    #: being re-padded; ``False`` (the default, safe for any term) re-pads. A term that reads more (DeBERTa's
    #: shared table) may declare it and override :meth:`sequence_terms`.
    per_sequence: ClassVar[bool] = False

    @classmethod
    def packs_per_sequence(cls) -> bool:
        """:attr:`per_sequence` as declared for this class's own :meth:`forward`: the declaration counts only when
        made by the class that defines ``forward`` or a subclass of it, so a subclass that changes ``forward``
        inherits no promise made about its parent's (it re-pads until it declares its own)."""
        if not cls.per_sequence:
            return False
        forward_owner = next(k for k in cls.__mro__ if "forward" in vars(k))
        declared_by = next(k for k in cls.__mro__ if "per_sequence" in vars(k))
        return issubclass(declared_by, forward_owner)

    @abstractmethod
    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: Positions) -> torch.Tensor:
        """Return the unscaled score term ``[b, h, q, k]`` for ``query [b, h, q, d]``, ``key [b, h, k, d]``.

        The attention module multiplies it by the softmax scale, as HF divides ``QKᵀ + bias`` by ``√d``. A term
        that declares :attr:`reads_projections` is called with the keyword ``projections`` as well.
        """

    def sequence_terms(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: Positions,
        projections: HeadProjections | None = None,
    ) -> SequenceTerms:
        """The term of each packed sequence, for a term that declares :attr:`per_sequence`.

        Args:
            query, key: the packed heads ``[T, h, d]`` of a right-padded batch (sequence ``i`` at positions
                ``0 … lᵢ - 1``, as in its padded row).
            positions: the padded batch's positions (the layer's).
            projections: the layer's projections (passed when :attr:`reads_projections`).

        Returns:
            ``(start, count, length) → [count, h, length, length]`` unscaled: the term of the ``count``
            sequences of ``length`` tokens packed from token ``start`` on, equal to the padded term's
            ``[i, :, :length, :length]`` of each. By default :meth:`forward` over those sequences alone, at
            :meth:`Positions.prefix`; called once per run of equal lengths, so work shared by every sequence
            (projecting a table) belongs before the returned function.
        """
        if not self.packs_per_sequence():
            raise UnsupportedError(
                f"{type(self).__name__} does not declare per_sequence for its forward: packed batches re-pad for it"
            )
        extra = {"projections": projections} if self.reads_projections else {}

        def term(start: int, count: int, length: int) -> torch.Tensor:
            q, k = (
                x[start : start + count * length].unflatten(0, (count, length)).transpose(1, 2) for x in (query, key)
            )
            return self(q, k, positions.prefix(length), **extra)

        return term

    def packed_term(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: Positions,
        projections: HeadProjections | None = None,
    ) -> PackedScoreTerm | None:
        """Every packed sequence's term at once, in the form a compiled graph hands to one op, or ``None``.

        Under ``torch.compile`` the loop of :meth:`sequence_terms` cannot be traced (the lengths are data): a term
        that returns a :class:`PackedScoreTerm` attends packed there too (``bertblocks::sdpa_varlen_biased``, see
        :mod:`bertblocks.plugins.varlen.biased`); ``None`` (the default) re-pads the compiled call. Only asked of a
        term that :meth:`packs_per_sequence`; the arguments are :meth:`sequence_terms`'. Return one only for a term
        whose entries read the positions through the distance ``i - j`` alone: a compiled graph packs left-padded
        batches too, and every sequence reads the top-left corner (see :class:`PackedScoreTerm`).
        """
        return None


@dataclass(frozen=True)
class PackedScoreTerm:
    """The unscaled score terms of all packed sequences, with shapes a compiled graph knows (no per-sequence size).

    Entry ``(i, j)`` of the term of the sequence packed from token ``s`` on is::

        rows[s + i, h, index[i, j]] + cols[s + j, h, index[i, j]] + fixed[0, h, i, j]

    each part optional (``None``: absent). ``L`` is the padded length: a right-padded sequence of ``l`` tokens reads
    the top-left ``[l, l]`` of ``index`` and ``fixed``, as in its padded row.

    Attributes:
        index: ``[L, L]`` int64, each pair's column into ``rows``/``cols`` (needed when either is given).
        rows: ``[T, h, N]``, per query token (a query's products with a position table ``E``: ``q · E``).
        cols: ``[T, h, N]``, per key token (a key's products with a position table: ``k · E``).
        fixed: ``[1, h|1, L, L]``, a term of the positions alone (a per-head slope times ``|i - j|``).
    """

    index: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    cols: torch.Tensor | None = None
    fixed: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if (self.rows is not None or self.cols is not None) and self.index is None:
            raise InputError("PackedScoreTerm: rows or cols are gathered through index, which is missing")


#: ``(start, count, length) → [count, h, length, length]``: the score term of ``count`` packed sequences of
#: ``length`` tokens from token ``start`` on (:meth:`PositionBias.sequence_terms`)
SequenceTerms = Callable[[int, int, int], torch.Tensor]


class SharedPositionBias(nn.Module, ABC):
    """An additive score term computed once per forward pass and used by every self-attention layer (MPNet's
    bucketed relative bias). The encoder registers it under :attr:`module_name` (checkpoint key
    ``encoder.relative_attention_bias.weight``) and passes its output to the layers in
    :attr:`Positions.score_bias`.
    """

    module_name: ClassVar[str] = "relative_attention_bias"

    @abstractmethod
    def forward(self, positions: Positions, dtype: torch.dtype) -> torch.Tensor:
        """Return ``[1|b, h, q, k]`` in ``dtype``, added to the *scaled* scores (after ``QKᵀ/√d``, as MPNet)."""


class SharedPositionTerm(nn.Module, ABC):
    """A value computed once per forward pass by the encoder and handed to every layer, typed: what
    :meth:`forward` returns must be an instance of :attr:`produces`, and layers read it with
    ``positions.term(produces)`` (DeBERTa's relative embedding table, normalised once for all layers).

    The encoder registers it under :attr:`module_name` (its parameters are ``encoder.<module_name>.*``), checks
    the type of what it returns and stores it in :attr:`Positions.shared`. Unlike :class:`SharedPositionBias`,
    it adds nothing to the scores itself: a per-layer :class:`PositionBias` reads it.
    """

    module_name: ClassVar[str] = "shared_position_term"
    #: the type :meth:`forward` returns (the key layers read it under)
    produces: ClassVar[type] = object

    @abstractmethod
    def forward(self, positions: Positions, dtype: torch.dtype) -> Any:
        """This pass's value (an instance of :attr:`produces`), in ``dtype`` where it holds floats."""


class Rotary(nn.Module, ABC):
    """Rotates queries and keys by their positions (RoPE), inside each self-attention layer.

    The attention calls it on the heads of this call's tokens, before the keys enter a KV cache, so cached keys
    keep the rotation of their own position and a cache gives exact results for chunks of any size.

    Shapes::

        query, key [B, t, h, d]   positions [B|1, t] int64   → rotated query, key [B, t, h, d]

    ``B, t`` is ``b, q`` for a padded batch and ``1, T`` for a packed one (``positions`` restart at 0 for every
    packed sequence). ``positions`` comes from :meth:`Positions.tokens`; ``memo`` (:attr:`Positions.memo`)
    may hold tables shared by the layers of one forward pass: store the positions tensor with them and reuse
    them only for that very tensor (``stored is positions``), as every layer gets the same one.
    """

    #: dimensions of each head it rotates (from the first); the rest pass through unchanged
    rotary_dim: int
    #: the attention also rotates the values (:meth:`rotate_value`), before they enter a cache (RoFormer's
    #: ``rotary_value``)
    rotates_value: bool = False

    @abstractmethod
    def forward(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, memo: dict[Any, Any] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rotate_value(
        self, value: torch.Tensor, positions: torch.Tensor, memo: dict[Any, Any] | None = None
    ) -> torch.Tensor:
        """``value [B, t, h, d]`` rotated by its positions; called only when :attr:`rotates_value` is set."""
        raise UnsupportedError(f"{type(self).__name__} declares rotates_value but does not rotate values")


@dataclass
class LayerPositionTerms:
    """What a position scheme puts into one self-attention layer.

    Attributes:
        bias: an unscaled per-layer score term (registered under its ``module_name``), or ``None``.
        rotary: the rotation of queries and keys, or ``None``.
    """

    bias: PositionBias | None = None
    rotary: Rotary | None = None


class PositionScheme:
    """How a model knows token order. Not a module itself: it *makes* modules for the places it acts.

    A scheme may do any of:

    * (a) add an embedding to the token embeddings (:meth:`embedding`; BERT's learned table);
    * (b) add a score bias: per layer (:meth:`attention_bias`, Shaw et al.'s distances) or shared by every layer
      and computed once per forward pass (:meth:`shared_bias`, MPNet's buckets);
    * (c) rotate queries and keys (:meth:`rotary`, RoPE);
    * (d) compute typed values once per pass for every layer's terms (:meth:`shared_terms`, DeBERTa's table).

    Per-layer modules come from :meth:`layer_terms`, which receives the layer index; a scheme whose layers
    differ overrides it (per-layer *options*, such as ModernBERT's two RoPE bases, are config overrides:
    ``encoder.overrides[].position``, and the builder then uses another instance of the scheme for those layers).
    """

    #: registry name, for messages
    name: ClassVar[str] = "?"
    #: checkpoint keys this scheme knows to be unused (e.g. the ``embeddings.position_embeddings.weight``
    #: that transformers 4.x writes for relative models); they are dropped on load without complaint.
    ignored_checkpoint_keys: ClassVar[tuple[str, ...]] = ()
    #: declared: :meth:`attention_bias` returns a bias (so every backend must take an additive mask). The
    #: builder reads the declaration instead of building and discarding a bias to find out; the conformance
    #: suite checks that it matches what the scheme does. A scheme that overrides :meth:`attention_bias` to
    #: return a bias sets it ``True``.
    adds_score_bias: ClassVar[bool] = False
    #: padded tokens of a 2-D attention mask have zero embeddings and, as queries, see no key (a uniform
    #: softmax over every key), as transformers' DeBERTa masks both sides; only padded positions change
    masks_padded_queries: bool = False
    #: ``max_positions`` bounds the sequence (an absolute table, a relative table indexed by distance); a scheme
    #: that buckets every distance and adds no absolute table sets it false (DeBERTa-v3 reads any length)
    limits_length: bool = True

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions

    def embedding(self, hidden_size: int) -> nn.Module | None:
        """Module mapping ``position_ids [b, q]`` → ``[b, q, H]``, or ``None`` if the scheme adds nothing."""
        return None

    def attention_bias(self, num_heads: int, head_dim: int) -> PositionBias | None:
        """A fresh per-layer score bias for self-attention, or ``None``."""
        return None

    def rotary(self, num_heads: int, head_dim: int) -> Rotary | None:
        """A fresh per-layer rotation of queries and keys, or ``None``."""
        return None

    def shared_bias(self, num_heads: int) -> SharedPositionBias | None:
        """The score bias shared by every layer (built once, owned by the encoder), or ``None``."""
        return None

    def shared_terms(self, model: ModelDims) -> list[SharedPositionTerm]:
        """Values computed once per forward pass for every layer (owned by the encoder; see
        :class:`SharedPositionTerm`); none by default."""
        return []

    def layer_terms(self, layer_index: int, num_heads: int, head_dim: int) -> LayerPositionTerms:
        """The modules of self-attention layer ``layer_index``: :meth:`attention_bias` and :meth:`rotary`."""
        return LayerPositionTerms(self.attention_bias(num_heads, head_dim), self.rotary(num_heads, head_dim))

    def problems(self, num_heads: int, head_dim: int) -> list[str]:
        """What makes this scheme unusable in a layer of ``num_heads`` heads of ``head_dim`` (e.g. an odd head
        dimension for RoPE); checked by ``validate`` for every layer, so the config fails there, not at build."""
        return []


# ---------------------------------------------------------------------------------------------- attention
@dataclass(frozen=True)
class BackendCapabilities:
    """What an attention backend can do; checked once when the model is built, never per call.

    Attributes:
        additive_mask: accepts a float ``[b, 1|h, q, k]`` mask added to the scaled scores. Needed for
            padding masks and for relative position biases.
        attention_weights: can return the probabilities (``output_attentions=True``).
        causal: honours ``is_causal`` (decoders).
        dropout: applies attention dropout in training.
        varlen: implements :meth:`AttentionBackend.varlen`, attention over packed sequences given by
            ``cu_seqlens``; packed batches then never return to the padded layout. Backends without it get
            packed batches re-padded for the attention call only (with a score bias computable per sequence,
            every backend gets one masked call per run of equal-length sequences instead).
    """

    additive_mask: bool = True
    attention_weights: bool = False
    causal: bool = False
    dropout: bool = True
    varlen: bool = False


class AttentionBackend(ABC):
    """The kernel: scaled dot-product attention over already projected heads.

    Shapes::

        query [b, h, q, d]   key/value [b, h, k, d]   mask [b|1, h|1, q|1, k] additive or None
        → output [b, h, q, d], weights [b, h, q, k] (post-dropout probabilities) or None
    """

    name: ClassVar[str] = "?"
    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities()

    @abstractmethod
    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        scale: float,
        dropout_p: float,
        is_causal: bool,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def varlen(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        scale: float,
        dropout_p: float,
    ) -> torch.Tensor:
        """Attention within each packed sequence: ``[T, h, d]`` each → ``[T, h, d]``.

        ``cu_seqlens [n + 1]`` (int32) delimits the sequences. Only called when ``capabilities.varlen``.
        """
        raise UnsupportedError(f"backend {self.name!r} does not implement varlen attention")

    def accepts_varlen(self, *, dropout_p: float) -> bool:
        """Whether this call may go through :meth:`varlen` (default: ``capabilities.varlen``). A backend whose
        varlen kernel has limits that depend on the call (dropout, compilation) says so here; the packed path
        then re-pads for that call instead."""
        return self.capabilities.varlen


class Attention(nn.Module, ABC):
    """Multi-head attention sub-layer *including* its output projection, residual and LayerNorm.

    Children follow HF's names so checkpoints load unchanged: ``self.{query,key,value}`` and
    ``output.{dense,LayerNorm}``.

    Attributes:
        capabilities: what the module can do (attention weights for all heads, some or none; pruning; the KV
            cache), declared on the class or per instance (see
            :class:`~bertblocks.core.capabilities.AttentionCapabilities`); the builder, the model and the
            conformance suite act on it. Default: everything.
        extra_inputs: forward inputs of the model beyond transformers' BERT ones that this attention reads
            (Longformer's ``global_attention_mask``): the backbone then accepts each as a keyword argument (and
            refuses any name no module declares: the embedding's and layer outputs' ``extra_inputs`` are the same
            door), and every layer calls the module with it as a keyword of the same name (``None`` when the caller
            gave none). Declared on the class.
        sequence_multiple: an exported graph (``torch.export``, ONNX) of a model with this module takes sequence
            lengths that are multiples of it (Longformer's one-sided window: its blocked layout has sizes a symbolic
            length cannot be proved to fit otherwise); the caller pads to it. Default 1: any length.
    """

    num_heads: int
    head_dim: int
    capabilities: AttentionCapabilities = AttentionCapabilities()
    extra_inputs: ClassVar[tuple[str, ...]] = ()
    sequence_multiple: int = 1

    def extra_input_specs(self) -> tuple[ExtraInput, ...]:
        """How each of :attr:`extra_inputs` looks (shape, dtype, an example): what an export makes graph inputs
        of. Default: per-token integer ``[batch, sequence]``; override for any other."""
        return default_extra_input_specs(self.extra_inputs)

    @abstractmethod
    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        encoder_hidden_states: torch.Tensor | None = None,
        cache: KVCache | None = None,
        layer_index: int = 0,
        is_causal: bool = False,
        packing: Packing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden_states [b, q, H]`` → ``([b, q, H], probabilities [b, h, q, k] or None)``.

        Args:
            mask: additive (see :mod:`bertblocks.core.masks`), over the keys this call attends to.
            positions: query and key positions (relative schemes use them; cached keys included).
            head_mask: ``[h_original]`` multipliers of each head's probabilities, indexed by the head numbers
                the layer had before any pruning.
            output_attentions: also return the probabilities.
            encoder_hidden_states: ``[b, s, H]``; given to a cross-attention module, keys and values come from
                them (and are computed once per cache).
            cache: the decoder's cache; self-attention appends its keys/values at ``layer_index``.
            is_causal: queries must not see later keys (decoder self-attention).
            packing: when set, ``hidden_states`` is a packed batch ``[1, T, H]`` of the real tokens of a padded
                batch (see :mod:`bertblocks.core.packing`); the output is packed the same way, while ``mask``,
                ``positions`` and the returned probabilities keep the padded layout.
        """

    @abstractmethod
    def prune_heads(self, heads: set[int]) -> None:
        """Remove heads (numbered as before any pruning) for good, shrinking the projections."""


# ------------------------------------------------------------------------------------------- feed-forward
class Intermediate(nn.Module, ABC):
    """First half of the feed-forward block: ``[b, q, H]`` → ``[b, q, I]`` (HF's ``intermediate``)."""

    @abstractmethod
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor: ...


class FeedForwardOutput(nn.Module, ABC):
    """Second half: ``([b, q, I], residual [b, q, H])`` → ``[b, q, H]``, residual and norm included.

    Built without a norm (``norm=None`` to the factory: a pre-LN or parallel layer, which adds the residual
    and normalises itself), it returns ``dropout(dense(intermediate))`` and ignores ``residual``.
    """

    #: per-token inputs the output reads beyond the hidden states (X-MOD's ``lang_ids``, choosing each token's
    #: language adapter): the backbone takes them as keywords, has :meth:`prepare_extra_inputs` of the first layer
    #: that declares them turn them into ``[b, q]`` tensors (packed with the tokens when the batch is packed), and the
    #: layer passes them to :meth:`forward` as keywords (``[b, q]``, or ``[1, T]`` packed)
    extra_inputs: tuple[str, ...] = ()
    #: whether the output, built without a norm (a pre-LN layer), still adds the residual itself and so returns the
    #: whole sub-layer: the layer then passes it the *un-normalised* input as ``residual`` and its feed-forward norm
    #: as the keyword ``norm``, and adds nothing after it (X-MOD's pre-norm adapters, whose own residual and reuse of
    #: that norm come after the block's residual)
    closes_residual: ClassVar[bool] = False

    @abstractmethod
    def forward(self, intermediate: torch.Tensor, residual: torch.Tensor) -> torch.Tensor: ...

    def extra_input_specs(self) -> tuple[ExtraInput, ...]:
        """How each of :attr:`extra_inputs` looks *as the caller gives it* (before :meth:`prepare_extra_inputs`;
        shape, dtype, an example): what an export makes graph inputs of. Default: per-token integer
        ``[batch, sequence]``; override for any other."""
        return default_extra_input_specs(self.extra_inputs)

    def prepare_extra_inputs(
        self, inputs: Mapping[str, torch.Tensor], batch: int, length: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """The given :attr:`extra_inputs` (those not given absent) checked and made per token: one ``[batch, length]``
        tensor for every name of :attr:`extra_inputs` (a default for one not given, or raise
        :class:`~bertblocks.errors.InputError` naming it). Data-dependent checks are skipped under ``torch.compile``."""
        return dict(inputs)


@dataclass
class FeedForward:
    """What a feed-forward plugin returns: two modules the layer registers as ``intermediate`` and ``output``.

    Why two modules and not one: HF keeps them as direct children of the layer
    (``encoder.layer.N.intermediate.dense``, ``encoder.layer.N.output.LayerNorm``), and registering them
    the same way keeps our state-dict keys identical to HF's without any renaming table.
    """

    intermediate: Intermediate
    output: FeedForwardOutput


class GroupedProjection(nn.Module, ABC):
    """A projection ``[..., in]`` → ``[..., out]`` in ``groups`` slices: output channels
    ``[g·out/groups, (g+1)·out/groups)`` read input slice ``g`` alone (ConvBERT's grouped feed-forward, SqueezeBERT's
    grouped pointwise convolutions; the built-in one is ``bertblocks.plugins.grouped_linear.GroupedLinear``).

    The declaration that int8 inference (``bertblocks.quantize``) reads: it quantizes every subclass as it quantizes
    an ``nn.Linear`` (per output channel, per token), from :meth:`rows`, whatever layout the weight is stored in.
    """

    in_features: int
    out_features: int
    groups: int
    #: one bias over all ``out`` outputs, or ``None``
    bias: nn.Parameter | None

    @abstractmethod
    def rows(self) -> torch.Tensor:
        """The weight as ``[out, in/groups]``: output channel ``o`` on row ``o``, over its group's input slice."""


# ------------------------------------------------------------------------------------------------ layers
@dataclass(frozen=True)
class LayerContext:
    """Per-forward facts layers need beyond the hidden states and mask; built once per forward pass by the stack
    (:class:`~bertblocks.core.encoder.Encoder`) and handed to every :meth:`Layer.forward`."""

    cache: KVCache | None = None
    is_causal: bool = False
    encoder_hidden_states: torch.Tensor | None = None  # [b, s, H]
    encoder_mask: torch.Tensor | None = None  # additive [b, 1, 1|q, s]
    layer_index: int = 0
    packing: Packing | None = None  # hidden states are the packed real tokens [1, T, H]
    #: the caller's inputs that attention modules declare they read (:attr:`Attention.extra_inputs`), by name
    inputs: Mapping[str, torch.Tensor] = field(default_factory=dict)
    #: the per-token inputs layers' outputs declare (``FeedForwardOutput.extra_inputs``): ``[b, q]``, packed ``[1, T]``
    token_inputs: Mapping[str, torch.Tensor] = field(default_factory=dict)


class Layer(nn.Module, ABC):
    """One layer of the stack: how attention, (cross-attention,) feed-forward, norms and residuals compose.

    Shapes::

        hidden_states [b, q, H] (packed: [1, T, H])   mask additive [b, 1, 1|q, k] or None
        → (hidden_states [b, q, H], self-attention probabilities [b, h, q, k] or None, cross ones or None)

    Attributes:
        attention: the self-attention sub-layer (pruning and the KV cache find it here).
    """

    attention: Attention
    #: whether the stack ends with a norm when the config's ``final_norm`` is null (pre-LN stacks need one)
    final_norm_default: ClassVar[bool] = False

    @abstractmethod
    def forward(
        self,
        hidden_states: torch.Tensor,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        context: LayerContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``context`` is the stack's :class:`LayerContext` (cache, causality, encoder states, layer index,
        packing) or ``None`` for a plain encoder pass."""


# ------------------------------------------------------------------------------------------ pooler, heads
class Pooler(nn.Module, ABC):
    """Sequence summary: ``([b, q, H], padding mask [b, k] or None)`` → ``[b, H]``."""

    @abstractmethod
    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor: ...


#: the default of one model input a call leaves out (``None``): ``(inputs, config) → tensor``, or ``None`` for none
#: (the input stays unset). ``inputs`` holds every input of the call by name in the caller's shapes (``[b, c, q]``
#: for multiple choice): BERT's, the model's extra inputs and the head's, ``None`` where not given, defaults made
#: before this one included. transformers' task classes that choose an input themselves (Longformer's global tokens,
#: BigBird's question mask) are such defaults; a head (:attr:`Head.input_defaults`) or a family
#: (``Family.input_defaults``) declares them, and the task model applies them, before the head's
#: :meth:`Head.prepare_inputs`, to the inputs its backbone or head takes.
InputDefault = Callable[[Mapping[str, "torch.Tensor | None"], "BertConfig"], "torch.Tensor | None"]


class Head(nn.Module, ABC):
    """A task head on top of the backbone (masked LM, classification, …): logits, and the loss from labels.

    Why the head's children are adopted by the task model: transformers keeps head modules as direct children
    of the task model (``cls.predictions.bias``, ``classifier.weight``, ``qa_outputs.weight``). A head names its
    children exactly so (``cls``, ``classifier``, ``dropout``, ``qa_outputs``), and the task model registers
    those children as its own, keeping the head itself as an unregistered attribute that holds the logic. The
    state-dict keys are then HF's without any renaming table (the same precedent as :class:`FeedForward`).
    A head should therefore hold no parameters or buffers of its own, only in children.

    A head keeps no per-call state: everything a call needs (the backbone output, the attention mask, the
    labels) comes as arguments, so one head serves interleaved batches.

    Shapes::

        output.last_hidden_state [b, q, H]   output.pooler_output [b, H] (only when needs_pooler)
        attention_mask [b, q] as the backbone got it (after prepare_inputs: [b·c, q] for multiple choice), or None
        batch_shape: leading shape of the caller's input_ids, (b,) — or (b, c) for multiple choice

    Attributes:
        needs_pooler: the head reads ``pooler_output``, so the backbone keeps its pooler (HF builds masked-LM,
            causal-LM, token-classification and QA models without one).
        label_names: the label keyword arguments the head takes (``labels``, ``next_sentence_label``,
            ``start_positions``, ``end_positions``); the task model refuses any other.
        config_fields: config fields the head reads and may write back (``problem_type``): the task model
            copies them onto the head's attributes of the same name before each call, and back after.
        reads_padded_positions: the head's outputs or loss depend on hidden states at padded positions (QA's
            softmax runs over every position, as HF's does), so the backbone must not pack padded batches
            automatically (packing leaves zeros there). Every component kind can make this declaration (see
            :mod:`bertblocks.core.capabilities`); the head's is added to the backbone's ``padding_readers``.
        reshapes_inputs: :meth:`prepare_inputs` changes the inputs' shape (multiple choice: ``[b, c, q]`` →
            ``[b·c, q]``); the conformance suite then gives the head such inputs.
        pools_padded_positions: a pooled (per-example) output reads a padded position, so changing the tokens
            there changes it, as it does in transformers (RoFormer's multiple choice takes each choice's last
            position); the conformance suite's padding check does not apply. Implies ``reads_padded_positions``.
        reads_input_ids: :meth:`forward` is also called with the keyword ``input_ids`` (the ids the backbone
            was given, after :meth:`prepare_inputs`, or ``None`` when the caller gave ``inputs_embeds``): BGE-M3's
            lexical weights are indexed by token id.
        extra_inputs: inputs of the task model's ``forward`` beyond BERT's that the head itself reads
            (BigBird's ``question_lengths``): the task model takes each as a keyword argument and calls
            :meth:`forward` with it as a keyword of the same name (``None`` when the call gives none and no
            default makes one).
        input_defaults: input name → :data:`InputDefault`: inputs the head fills in when the call leaves them out
            (an extra input of its own, or one the backbone takes); applied in this order, so a later default
            reads an earlier one. A family's defaults for this head (``Family.input_defaults``) come first.
        omits_pooler: transformers builds this head's backbone without a pooler even where the family keeps one
            for every other head (``pooler.always``: BigBird's, whose question-answering class passes
            ``add_pooling_layer=False``).
        companion_files: module name (as the head's modules sit on the task model) → the stem of a weight file of
            that module's own beside a checkpoint's weights, read when the weight files hold none of the module's
            tensors: BGE-M3 publishes its heads as ``colbert_linear.pt`` and ``sparse_linear.pt``
            (:func:`bertblocks.hf.weight_files.read_companion_file`: safetensors only, pickles refused). A save
            writes the module's tensors with the rest, as transformers would.
    """

    # class-level defaults; a head may set any of them per instance (a composed head derives them from its parts)
    needs_pooler: bool = False
    reads_padded_positions: bool = False
    pools_padded_positions: bool = False
    reads_input_ids: bool = False
    extra_inputs: tuple[str, ...] = ()
    input_defaults: Mapping[str, InputDefault] = MappingProxyType({})
    omits_pooler: bool = False
    companion_files: Mapping[str, str] = MappingProxyType({})
    reshapes_inputs: bool = False
    label_names: tuple[str, ...] = ("labels",)
    config_fields: tuple[str, ...] = ()

    def prepare_inputs(self, inputs: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        """Reshape the backbone inputs (``input_ids``, ``attention_mask``, ``token_type_ids``, ``position_ids``,
        ``inputs_embeds``) before the backbone runs; identity unless the head reads inputs of another rank
        (then set :attr:`reshapes_inputs`). Must not keep anything for :meth:`forward`: the mask reaches
        :meth:`forward` as an argument."""
        return inputs

    @abstractmethod
    def forward(
        self,
        output: ModelOutputWithPooling,
        labels: Mapping[str, torch.Tensor],
        batch_shape: tuple[int, ...],
        *,
        attention_mask: torch.Tensor | None,
    ) -> ModelOutput:
        """Logits (and, when ``labels`` holds every label the loss needs, the loss) from the backbone output.

        Args:
            output: what the backbone returned.
            labels: the label tensors given, by keyword (only names from :attr:`label_names`).
            batch_shape: leading shape of the caller's inputs, before :meth:`prepare_inputs`.
            attention_mask: the attention mask the backbone was given (after :meth:`prepare_inputs`), or
                ``None``: every position is real. Pooling and masked losses read it.

        Returns:
            An output with transformers' field names; the task model fills in ``hidden_states``,
            ``attentions`` (and the decoder fields) from the backbone output where the type has them.

        Raises:
            ValueError: labels of the wrong shape, dtype or range, saying which and what was expected.
        """

    def tie_weights(self, input_embeddings: nn.Embedding) -> None:
        """Share weights with the token embedding table (a masked-LM decoder), if the head was built to.

        Called by the task model once the head is initialised, so initialisation never overwrites the
        embeddings through a tied weight.
        """
