"""MegatronBERT (``model_type: megatron-bert``): NVIDIA Megatron-LM's BERT, pre-LN, in transformers' classes.

Composition: BERT's config.json fields, heads (``cls.…``, the pooler, next-sentence prediction) and tokenizer, with
``pre_ln`` layers and their final norm (:mod:`bertblocks.families._pre_ln`) and embeddings without a LayerNorm
(``embedding.norm: false``: Megatron moved it into the layers; the embeddings are word + position + token type,
then dropout).

The checkpoint: prefix ``bert.`` (BERT's); ``encoder.layer.{i}.attention.ln`` ↔ ``attention_norm``
(``crossattention.ln`` ↔ ``crossattention_norm``), ``encoder.layer.{i}.ln`` ↔ ``feedforward_norm``, ``encoder.ln`` ↔
``encoder.final_norm``. transformers' MegatronBERT has no ``position_embedding_type``: positions are learned
absolute ones (``position.name: absolute``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component

from ._pre_ln import PreLNLayout
from .bert import BERT_ARCHITECTURES
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .family import Family
from .keymap import BACKBONE_PREFIX, KeyMap

LAYOUT = PreLNLayout(attention_norm="ln", feedforward_norm="ln", final_norm="encoder.ln", embedding_norm=False)
#: MegatronBertConfig's defaults where they differ from bertblocks' (a config.json without the field means these:
#: the 345M checkpoints' dimensions, the cased vocabulary)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 29056,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
}
KEY_MAP = KeyMap(
    prefix=BACKBONE_PREFIX,
    rules=LAYOUT.rules(BACKBONE_PREFIX),
    head_prefixes=("cls.", "classifier.", "qa_outputs."),
)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    return bert_fields_from_hf({**DEFAULTS, **hf})


def _to_hf(config: BertConfig) -> dict[str, Any]:
    return bert_fields_to_hf(config, dropped=("position_embedding_type",))


MEGATRON_BERT = Family(
    model_type="megatron-bert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=BERT_FIELDS,
    key_map=KEY_MAP,
    architectures={
        ("MegatronBertForCausalLM" if name == "BertLMHeadModel" else name.replace("Bert", "MegatronBert")): head
        for name, head in BERT_ARCHITECTURES.items()
    },
    base_architecture="MegatronBertModel",
    fixed={"position.name": "absolute", **LAYOUT.fixed},
    description="MegatronBERT: BERT with pre-LN layers, a final norm and no embedding norm",
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "megatron-bert", lambda **_: MEGATRON_BERT, description=MEGATRON_BERT.description)]
