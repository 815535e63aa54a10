"""Built-in components. Each module registers its components through ``bertblocks_register_components``,
the same hook a third-party plugin implements."""

from __future__ import annotations

from . import attention, backends, embeddings, feedforward, poolers, positions

BUILTIN_PLUGINS = (embeddings, positions, attention, backends, feedforward, poolers)

__all__ = ["BUILTIN_PLUGINS"]
