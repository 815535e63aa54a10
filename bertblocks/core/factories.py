"""The contract of every component kind, in one place: what its factory is called with, which of those
arguments are sub-components (and of which kind), and what it must return.

:data:`CONTRACTS` is the one table: the registry answers a kind's contract from it
(:meth:`bertblocks.registry.Registry.contract`), and the builder (:mod:`bertblocks.registry.builder`) calls every
factory with exactly the row's arguments (plus ``build`` when the component's options declare
:func:`~bertblocks.core.component.subcomponent` fields) and refuses what does not return the row's type, naming
the component, the kind and the config path. ``docs/plugins/hooks.md`` documents each argument; tests check the
protocols, the rows, the docs and what the builder passes against each other. A factory may accept ``**_: Any``
to ignore arguments a later version adds.

Example:
    >>> def my_backend(*, options: MyOptions) -> AttentionBackend: ...
    >>> checked: BackendFactory = my_backend  # a type checker verifies the signature
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from pydantic import BaseModel
from torch import nn

from .interfaces import (
    Attention,
    AttentionBackend,
    Embedding,
    FeedForward,
    Head,
    Layer,
    ModelDims,
    Pooler,
    PositionScheme,
)


class PositionFactory(Protocol):
    """Kind ``position``; ``model`` gives the model's sizes (width, heads, layers, norm epsilon) for a scheme
    that builds per-model tables or shares terms between layers."""

    def __call__(self, *, max_positions: int, model: ModelDims, options: BaseModel) -> PositionScheme: ...


class EmbeddingFactory(Protocol):
    """Kind ``embedding``."""

    def __call__(
        self,
        *,
        vocab_size: int,
        hidden_size: int,
        type_vocab_size: int,
        pad_token_id: int | None,
        layer_norm_eps: float,
        dropout: float,
        position: PositionScheme,
        options: BaseModel,
    ) -> Embedding: ...


class AttentionFactory(Protocol):
    """Kind ``attention`` (called once more per layer for cross-attention, with a scheme that adds nothing).

    ``norm`` makes the norm that ends the sub-layer (post-LN: ``norm(dropout(dense(x)) + residual)``), or is
    ``None`` when the layer normalises and adds the residual itself (return ``dropout(dense(x))``).
    """

    def __call__(
        self,
        *,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        hidden_dropout: float,
        layer_norm_eps: float,
        backend: AttentionBackend,
        position: PositionScheme,
        layer_index: int,
        options: BaseModel,
        norm: Callable[[], nn.Module] | None,
    ) -> Attention: ...


class BackendFactory(Protocol):
    """Kind ``backend``: a pure function of its inputs, so it gets nothing but its options."""

    def __call__(self, *, options: BaseModel) -> AttentionBackend: ...


class ActivationFactory(Protocol):
    """Kind ``activation``: a fresh activation module per call."""

    def __call__(self, *, options: BaseModel) -> nn.Module: ...


class FeedForwardFactory(Protocol):
    """Kind ``feedforward``; ``activation()`` makes the configured activation module."""

    def __call__(
        self,
        *,
        hidden_size: int,
        intermediate_size: int,
        activation: Callable[[], nn.Module],
        dropout: float,
        layer_norm_eps: float,
        options: BaseModel,
        norm: Callable[[], nn.Module] | None,
    ) -> FeedForward: ...


class NormFactory(Protocol):
    """Kind ``norm``: a fresh norm module per call (each place a norm sits has its own parameters)."""

    def __call__(self, *, hidden_size: int, eps: float, options: BaseModel) -> nn.Module: ...


class LayerFactory(Protocol):
    """Kind ``layer``: composes sub-layers it makes with ``attention(norm)``, ``crossattention(norm)`` (or
    ``None``: no cross-attention) and ``feedforward(norm)``, passing ``norm`` (post-LN) or ``None``.

    A layer whose sub-layers work at another width than the residual stream (MobileBERT's bottleneck) passes it:
    ``attention(norm, hidden_size=128)``, ``feedforward(norm, hidden_size=128)``, ``norm(hidden_size=128)`` (and
    ``norm(eps=...)`` for a norm with its own epsilon)."""

    def __call__(
        self,
        *,
        attention: Callable[[Callable[[], nn.Module] | None], Attention],
        crossattention: Callable[[Callable[[], nn.Module] | None], Attention] | None,
        feedforward: Callable[[Callable[[], nn.Module] | None], FeedForward],
        norm: Callable[[], nn.Module],
        hidden_size: int,
        chunk_size_feed_forward: int,
        layer_index: int,
        num_layers: int,
        options: BaseModel,
    ) -> Layer: ...


class PoolerFactory(Protocol):
    """Kind ``pooler``."""

    def __call__(self, *, hidden_size: int, options: BaseModel) -> Pooler: ...


class HeadFactory(Protocol):
    """Kind ``head``; ``classifier_dropout`` is already resolved (``hidden_dropout_prob`` when unset)."""

    def __call__(
        self,
        *,
        hidden_size: int,
        vocab_size: int,
        num_labels: int,
        layer_norm_eps: float,
        activation: Callable[[], nn.Module],
        classifier_dropout: float,
        hidden_dropout_prob: float,
        intermediate_size: int,
        tie_word_embeddings: bool,
        is_decoder: bool,
        options: BaseModel,
    ) -> Head: ...


@dataclass(frozen=True)
class KindContract:
    """What the factories of one kind receive and return.

    Attributes:
        kind: the kind's name.
        returns: the class every factory of the kind must return an instance of (checked by the builder).
        protocol: the factory's typed signature (a :class:`~typing.Protocol`), for type checkers and docs;
            ``None`` for a kind a plugin declares.
        arguments: the keyword arguments every factory of the kind is called with, ``options`` included;
            ``None`` for a kind a plugin declares (its factories get ``options`` and what the component
            building them passes to ``build``).
        subcomponents: which arguments are made of other components, and of which kind (``norm`` is a
            factory of fresh ``norm`` modules, ``position`` the model's position scheme, …).
    """

    kind: str
    returns: type
    protocol: type[Any] | None = None
    arguments: frozenset[str] | None = None
    subcomponents: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def contract(
    kind: str, protocol: type[Any], returns: type, arguments: str, subcomponents: Mapping[str, str] | None = None
) -> KindContract:
    """A built-in kind's row: ``arguments`` space-separated (``options`` is added)."""
    return KindContract(
        kind, returns, protocol, frozenset({*arguments.split(), "options"}), MappingProxyType(dict(subcomponents or {}))
    )


#: the component kinds' contracts, by kind. The kind ``family`` is the families package's
#: (:data:`bertblocks.families.family.FAMILY_CONTRACT`): core knows no checkpoint format
CONTRACTS: Mapping[str, KindContract] = MappingProxyType(
    {
        "embedding": contract(
            "embedding",
            EmbeddingFactory,
            Embedding,
            "vocab_size hidden_size type_vocab_size pad_token_id layer_norm_eps dropout position",
            {"position": "position"},
        ),
        "position": contract("position", PositionFactory, PositionScheme, "max_positions model"),
        "attention": contract(
            "attention",
            AttentionFactory,
            Attention,
            "hidden_size num_heads dropout hidden_dropout layer_norm_eps backend position layer_index norm",
            {"backend": "backend", "position": "position", "norm": "norm"},
        ),
        "backend": contract("backend", BackendFactory, AttentionBackend, ""),
        "feedforward": contract(
            "feedforward",
            FeedForwardFactory,
            FeedForward,
            "hidden_size intermediate_size activation dropout layer_norm_eps norm",
            {"activation": "activation", "norm": "norm"},
        ),
        "activation": contract("activation", ActivationFactory, nn.Module, ""),
        "norm": contract("norm", NormFactory, nn.Module, "hidden_size eps"),
        "layer": contract(
            "layer",
            LayerFactory,
            Layer,
            "attention crossattention feedforward norm hidden_size chunk_size_feed_forward layer_index num_layers",
            {"attention": "attention", "crossattention": "attention", "feedforward": "feedforward", "norm": "norm"},
        ),
        "pooler": contract("pooler", PoolerFactory, Pooler, "hidden_size"),
        "head": contract(
            "head",
            HeadFactory,
            Head,
            "hidden_size vocab_size num_labels layer_norm_eps activation classifier_dropout hidden_dropout_prob "
            "intermediate_size tie_word_embeddings is_decoder",
            {"activation": "activation"},
        ),
    }
)

__all__ = [
    "CONTRACTS",
    "ActivationFactory",
    "AttentionFactory",
    "BackendFactory",
    "EmbeddingFactory",
    "FeedForwardFactory",
    "HeadFactory",
    "KindContract",
    "LayerFactory",
    "NormFactory",
    "PoolerFactory",
    "PositionFactory",
    "contract",
]
