"""The built-in model families, one module per family, and the heads they add. Each registers through
``bertblocks_register_components`` (kind ``family``, named by its HF ``model_type``), as a third party would."""

from __future__ import annotations

from . import (
    albert,
    bert,
    distilbert,
    electra,
    ernie,
    hybrid,
    jina_embeddings_v3,
    modernbert,
    mpnet,
    nomic_bert,
    roberta,
    task_heads,
    transform_heads,
)

FAMILY_PLUGINS = (
    bert,
    roberta,
    electra,
    distilbert,
    albert,
    mpnet,
    ernie,
    modernbert,
    nomic_bert,
    jina_embeddings_v3,
    hybrid,
    task_heads,
    transform_heads,
)

__all__ = ["FAMILY_PLUGINS"]
