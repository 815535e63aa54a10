"""The built-in model families, one module per HF ``model_type``. Each registers through
``bertblocks_register_components`` (kind ``family``), as a third party would. Modules starting with ``_`` are
helpers several families share."""

from __future__ import annotations

from . import (
    albert,
    bert,
    deberta_v2,
    distilbert,
    electra,
    ernie,
    eurobert,
    hybrid,
    jina_embeddings_v3,
    modernbert,
    mpnet,
    neobert,
    nomic_bert,
    roberta,
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
    deberta_v2,
    eurobert,
    neobert,
    hybrid,
)

__all__ = ["FAMILY_PLUGINS"]
