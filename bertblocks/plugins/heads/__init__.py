"""Task heads, each a composition of a pooling, a transform, an output layer and a loss
(:mod:`.composition`; the pieces in :mod:`.pooling`, :mod:`.transforms`, :mod:`.projections`, :mod:`.losses`).

Every registered name is in :mod:`.catalog`; the compositions are BERT's (:mod:`.bert`), the other families'
(:mod:`.task_heads`), and the heads with a transform before every output layer (:mod:`.transform_heads`).
"""

from __future__ import annotations

from . import catalog

HEAD_PLUGINS = (catalog,)

__all__ = ["HEAD_PLUGINS"]
