"""Turns a validated config into modules: looks every component up once and injects flat, typed arguments
(an attention module receives ``num_heads``, a backend and a position scheme, never the whole config)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import BaseModel
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.config import BertConfig, ComponentSpec
from bertblocks.core.encoder import Encoder, TransformerLayer
from bertblocks.core.interfaces import (
    Attention,
    AttentionBackend,
    Embedding,
    FeedForward,
    Head,
    Pooler,
    PositionScheme,
)
from bertblocks.core.limits import check_size

from .errors import RegistryError
from .manager import Registry, get_registry


class BuildError(RegistryError, ValueError):
    """A valid config whose components cannot work together (e.g. a backend lacking a needed capability)."""


@dataclass
class Assembled:
    """The parts of a backbone, as built from a config."""

    embeddings: Embedding
    encoder: Encoder
    pooler: Pooler | None
    position: PositionScheme


def build_components(config: BertConfig, registry: Registry | None = None) -> Assembled:
    """Assemble the embeddings, the encoder stack and the pooler of a validated ``config``.

    Raises:
        LimitError: the model would exceed a resource limit (:mod:`bertblocks.core.limits`).
        BuildError: a component refused the job (capability missing, factory returned the wrong type).
    """
    check_size(config)  # before anything is allocated: a config is data, but data that says how much memory
    reg = registry or get_registry()
    position = _make(
        reg,
        "position",
        config.position,
        PositionScheme,
        "position",
        max_positions=config.max_position_embeddings,
    )
    embeddings = _make(
        reg,
        "embedding",
        config.embedding,
        Embedding,
        "embedding",
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        type_vocab_size=config.type_vocab_size,
        pad_token_id=config.pad_token_id,
        layer_norm_eps=config.layer_norm_eps,
        dropout=config.hidden_dropout_prob,
        position=position,
    )
    enc = config.encoder
    shared_bias = position.shared_bias(enc.attention.num_heads)
    layers = []
    for i in range(enc.num_layers):
        attention_spec, ff_spec = enc.layer_specs(i)
        where = f"encoder layer {i}"
        position_spec = enc.layer_position(i, config.position)
        layer_position = (
            position
            if position_spec == config.position
            else _make(
                reg,
                "position",
                position_spec,
                PositionScheme,
                f"{where} position",
                max_positions=config.max_position_embeddings,
            )
        )
        backend = _make(reg, "backend", attention_spec.backend, AttentionBackend, f"{where} backend")
        if shared_bias is not None and attention_spec.num_heads != enc.attention.num_heads:
            raise BuildError(
                f"{where}: the {config.position.name!r} position scheme shares one bias over "
                f"{enc.attention.num_heads} heads by all layers, but this layer has {attention_spec.num_heads}"
            )
        adds_bias = layer_position.adds_score_bias
        if adds_bias is None:  # undeclared (a plugin older than the declaration): build one bias to find out
            head_dim = config.hidden_size // attention_spec.num_heads
            adds_bias = layer_position.attention_bias(attention_spec.num_heads, head_dim) is not None
        if (adds_bias or shared_bias is not None) and not backend.capabilities.additive_mask:
            raise BuildError(
                f"{where}: backend {attention_spec.backend.name!r} cannot take an additive score bias, which "
                f"the {position_spec.name!r} position scheme needs; choose a backend that can (eager, sdpa)"
            )
        if config.is_decoder and not backend.capabilities.causal:
            raise BuildError(
                f"{where}: backend {attention_spec.backend.name!r} cannot do causal attention, which a decoder "
                "(is_decoder: true) needs; choose a backend that can (eager, sdpa)"
            )
        make_attention = partial(
            _make,
            reg,
            "attention",
            attention_spec,
            Attention,
            hidden_size=config.hidden_size,
            num_heads=attention_spec.num_heads,
            dropout=attention_spec.dropout,
            hidden_dropout=config.hidden_dropout_prob,
            layer_norm_eps=config.layer_norm_eps,
            backend=backend,
            layer_index=i,
        )
        attention = make_attention(f"{where} attention", position=layer_position)
        # Cross-attention never carries a position bias (HF builds it with absolute positions).
        crossattention = (
            make_attention(f"{where} cross-attention", position=PositionScheme(config.max_position_embeddings))
            if config.add_cross_attention
            else None
        )
        activation = reg.get("activation", ff_spec.activation)
        feedforward = _make(
            reg,
            "feedforward",
            ff_spec,
            FeedForward,
            f"{where} feedforward",
            hidden_size=config.hidden_size,
            intermediate_size=ff_spec.intermediate_size,
            activation=partial(_call, activation, nn.Module, f"{where} activation", options=_options(activation, {})),
            dropout=config.hidden_dropout_prob,
            layer_norm_eps=config.layer_norm_eps,
        )
        layers.append(TransformerLayer(attention, feedforward, enc.chunk_size_feed_forward, crossattention))
    pooler = (
        _make(reg, "pooler", config.pooler, Pooler, "pooler", hidden_size=config.hidden_size)
        if config.pooler is not None
        else None
    )
    return Assembled(embeddings, Encoder(layers, shared_bias), pooler, position)


def build_head(config: BertConfig, registry: Registry | None = None) -> Head:
    """Build the head ``config.head`` names, with flat keyword arguments (see ``docs/how-to/task-heads.md``).

    Raises:
        BuildError: the config names no head, or the plugin returned something that is not a :class:`Head`.
    """
    if config.head is None:
        raise BuildError("the config names no head (set head: masked_lm, sequence_classification, …)")
    reg = registry or get_registry()
    component = reg.get("head", config.head.name)
    activation = reg.get("activation", config.encoder.feedforward.activation)
    dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    try:
        head = component.factory(
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            num_labels=config.num_labels,
            layer_norm_eps=config.layer_norm_eps,
            activation=partial(activation.factory, options=activation.options.model_validate({})),
            classifier_dropout=dropout,
            tie_word_embeddings=config.tie_word_embeddings,
            is_decoder=config.is_decoder,
            options=component.options.model_validate(config.head.options()),
        )
    except ValueError as e:  # a head refusing the config (e.g. QA with num_labels != 2)
        raise BuildError(f"head {config.head.name!r} from {component.provider}: {e}") from None
    if not isinstance(head, Head):
        raise BuildError(
            f"head {config.head.name!r} from {component.provider} returned {type(head).__name__}, not a Head"
        )
    return head


def _options(component: Component, given: dict[str, Any]) -> BaseModel:
    return component.options.model_validate(given)


def _make(reg: Registry, kind: str, spec: ComponentSpec, expected: type, where: str, **kwargs: Any) -> Any:
    component = reg.get(kind, spec.name)
    return _call(component, expected, where, options=_options(component, spec.options()), **kwargs)


def _call(component: Component, expected: type, where: str, **kwargs: Any) -> Any:
    try:
        made = component.factory(**kwargs)
    except BuildError:
        raise
    except Exception as e:
        # a plugin's bug (or a refusal) must say which layer, component and distribution it came from
        raise BuildError(
            f"{where}: {component.kind} {component.name!r} from {component.provider} failed to build: "
            f"{type(e).__name__}: {e}"
        ) from e
    if not isinstance(made, expected):
        raise BuildError(
            f"{where}: {component.kind} {component.name!r} from {component.provider} returned "
            f"{type(made).__name__}, not a {expected.__name__}"
        )
    return made
