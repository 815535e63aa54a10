"""Built-in components and presets. Each module registers through the same hooks a third-party plugin
implements (``bertblocks_register_components``, ``bertblocks_register_presets``)."""

from __future__ import annotations

from . import (
    attention,
    backends,
    bottleneck,
    conv_layers,
    disentangled,
    embeddings,
    feedforward,
    layers,
    norms,
    poolers,
    positions,
    presets,
)
from .heads import HEAD_PLUGINS

BUILTIN_PLUGINS = (
    embeddings,
    positions,
    disentangled,
    attention,
    backends,
    feedforward,
    norms,
    layers,
    conv_layers,
    bottleneck,
    poolers,
    *HEAD_PLUGINS,
    presets,
)

__all__ = ["BUILTIN_PLUGINS"]
