"""Interfaces, config schema, masks, outputs and the encoder skeleton. Knows torch and pydantic only."""

from __future__ import annotations

from .component import KINDS, Component, Kind, NoOptions
from .config import BertConfig, ConfigError, ConfigIssue
from .encoder import Encoder, EncoderModel, TransformerLayer
from .interfaces import (
    Attention,
    AttentionBackend,
    BackendCapabilities,
    Embedding,
    FeedForward,
    FeedForwardOutput,
    Head,
    Intermediate,
    Layer,
    Pooler,
    PositionBias,
    Positions,
    PositionScheme,
)
from .outputs import EncoderOutput, ModelOutput, ModelOutputWithPooling

__all__ = [
    "KINDS",
    "Attention",
    "AttentionBackend",
    "BackendCapabilities",
    "BertConfig",
    "Component",
    "ConfigError",
    "ConfigIssue",
    "Embedding",
    "Encoder",
    "EncoderModel",
    "EncoderOutput",
    "FeedForward",
    "FeedForwardOutput",
    "Head",
    "Intermediate",
    "Kind",
    "Layer",
    "ModelOutput",
    "ModelOutputWithPooling",
    "NoOptions",
    "Pooler",
    "PositionBias",
    "PositionScheme",
    "Positions",
    "TransformerLayer",
]
