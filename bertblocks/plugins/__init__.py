"""Built-in components and presets. Each module registers through the same hooks a third-party plugin
implements (``bertblocks_register_components``, ``bertblocks_register_presets``)."""

from __future__ import annotations

from . import attention, backends, embeddings, feedforward, heads, layers, norms, poolers, positions, presets
from .families import FAMILY_PLUGINS

BUILTIN_PLUGINS = (
    embeddings,
    positions,
    attention,
    backends,
    feedforward,
    norms,
    layers,
    poolers,
    heads,
    presets,
    *FAMILY_PLUGINS,
)

__all__ = ["BUILTIN_PLUGINS"]
