"""The built-in model families, one module per HF ``model_type``. Each registers through
``bertblocks_register_components`` (kind ``family``), as a third party would. Modules starting with ``_`` are
helpers several families share; :mod:`.bertlike` (the BERT-shaped config.json fields) is public, for family plugins."""

from __future__ import annotations

from . import (
    albert,
    bert,
    data2vec_text,
    deberta,
    deberta_v2,
    distilbert,
    electra,
    ernie,
    esm,
    eurobert,
    gte,
    hybrid,
    jina_bert,
    jina_embeddings_v3,
    megatron_bert,
    mobilebert,
    modernbert,
    mpnet,
    neobert,
    nomic_bert,
    roberta,
    roberta_prelayernorm,
    roformer,
    xlm_roberta_xl,
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
    gte,
    roformer,
    esm,
    jina_bert,
    eurobert,
    neobert,
    hybrid,
    roberta_prelayernorm,
    megatron_bert,
    xlm_roberta_xl,
    data2vec_text,
    deberta,
    mobilebert,
)

__all__ = ["FAMILY_PLUGINS"]
