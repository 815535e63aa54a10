"""The contract of every component kind, in one place: what its factory is called with and what it returns.

The builder (:mod:`bertblocks.registry.builder`) calls a component's factory with exactly these keyword
arguments (``docs/plugins/hooks.md`` documents each; a test checks both against what the builder passes), and
checks the returned type. A factory may accept ``**_: Any`` to ignore arguments a later version adds.

Example:
    >>> def my_backend(*, options: MyOptions) -> AttentionBackend: ...
    >>> checked: BackendFactory = my_backend  # a type checker verifies the signature
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel
from torch import nn

from .interfaces import Attention, AttentionBackend, Embedding, FeedForward, Head, Layer, Pooler, PositionScheme


class PositionFactory(Protocol):
    """Kind ``position``."""

    def __call__(self, *, max_positions: int, options: BaseModel) -> PositionScheme: ...


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
    ``None``: no cross-attention) and ``feedforward(norm)``, passing ``norm`` (post-LN) or ``None``."""

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
        tie_word_embeddings: bool,
        is_decoder: bool,
        options: BaseModel,
    ) -> Head: ...


#: kind → (the factory's protocol, the type the factory must return). The kind ``family`` is the families
#: package's (:data:`bertblocks.families.family.FAMILY_FACTORY`): core knows no checkpoint format
FACTORIES: dict[str, tuple[type[Any], type[Any]]] = {
    "embedding": (EmbeddingFactory, Embedding),
    "position": (PositionFactory, PositionScheme),
    "attention": (AttentionFactory, Attention),
    "backend": (BackendFactory, AttentionBackend),
    "feedforward": (FeedForwardFactory, FeedForward),
    "activation": (ActivationFactory, nn.Module),
    "norm": (NormFactory, nn.Module),
    "layer": (LayerFactory, Layer),
    "pooler": (PoolerFactory, Pooler),
    "head": (HeadFactory, Head),
}

__all__ = [
    "FACTORIES",
    "ActivationFactory",
    "AttentionFactory",
    "BackendFactory",
    "EmbeddingFactory",
    "FeedForwardFactory",
    "HeadFactory",
    "LayerFactory",
    "NormFactory",
    "PoolerFactory",
    "PositionFactory",
]
