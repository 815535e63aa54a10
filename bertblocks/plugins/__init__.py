"""Built-in components and presets. Each module registers through the same hooks a third-party plugin
implements (``bertblocks_register_components``, ``bertblocks_register_presets``)."""

from __future__ import annotations

from . import (
    adapters,
    attention,
    backends,
    block_sparse,
    bottleneck,
    conv_layers,
    disentangled,
    embeddings,
    feedforward,
    grouped_conv,
    layers,
    longformer,
    mixed_attention,
    norms,
    nystrom,
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
    mixed_attention,
    longformer,
    block_sparse,
    backends,
    feedforward,
    grouped_conv,
    adapters,
    norms,
    layers,
    conv_layers,
    nystrom,
    bottleneck,
    poolers,
    *HEAD_PLUGINS,
    presets,
)

__all__ = ["BUILTIN_PLUGINS"]
