"""Interfaces, factories, masks, the KV cache, packing, outputs and the encoder skeleton. Knows torch and the config."""

from __future__ import annotations

from .capabilities import AttentionCapabilities, CapabilityError
from .component import KINDS, Component, Kind, NoOptions
from .encoder import Encoder, EncoderModel
from .interfaces import (
    Attention,
    AttentionBackend,
    BackendCapabilities,
    Embedding,
    ExtraInput,
    FeedForward,
    FeedForwardOutput,
    GroupedProjection,
    Head,
    InputDefault,
    Intermediate,
    Layer,
    LayerContext,
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
    "AttentionCapabilities",
    "BackendCapabilities",
    "CapabilityError",
    "Component",
    "Embedding",
    "Encoder",
    "EncoderModel",
    "EncoderOutput",
    "ExtraInput",
    "FeedForward",
    "FeedForwardOutput",
    "GroupedProjection",
    "Head",
    "InputDefault",
    "Intermediate",
    "Kind",
    "Layer",
    "LayerContext",
    "ModelOutput",
    "ModelOutputWithPooling",
    "NoOptions",
    "Pooler",
    "PositionBias",
    "PositionScheme",
    "Positions",
]
