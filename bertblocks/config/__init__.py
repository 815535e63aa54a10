"""The config: one pydantic model tree, its per-layer overrides, its errors and its size limits.

Knows pydantic (and torch, for the element size in the memory estimate) only: no component, no registry, no
checkpoint format.
"""

from __future__ import annotations

from .errors import (
    ConfigError,
    ConfigFileNotFoundError,
    ConfigIssue,
    FieldError,
    issues_from_validation_error,
    join_loc,
)
from .overrides import OVERRIDABLE, EncoderConfig, LayerOverride, deep_merge, merge_spec
from .schema import BertConfig
from .specs import (
    DEFAULT_COMPONENTS,
    AttentionSpec,
    BackendSpec,
    ComponentSpec,
    EmbeddingSpec,
    FeedForwardSpec,
    HeadSpec,
    LayerSpec,
    NormSpec,
    PoolerSpec,
    PositionSpec,
    Probability,
)

__all__ = [
    "DEFAULT_COMPONENTS",
    "OVERRIDABLE",
    "AttentionSpec",
    "BackendSpec",
    "BertConfig",
    "ComponentSpec",
    "ConfigError",
    "ConfigFileNotFoundError",
    "ConfigIssue",
    "EmbeddingSpec",
    "EncoderConfig",
    "FeedForwardSpec",
    "FieldError",
    "HeadSpec",
    "LayerOverride",
    "LayerSpec",
    "NormSpec",
    "PoolerSpec",
    "PositionSpec",
    "Probability",
    "deep_merge",
    "issues_from_validation_error",
    "join_loc",
    "merge_spec",
]
