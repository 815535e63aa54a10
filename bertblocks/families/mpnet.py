"""MPNet: RoBERTa's embeddings without token types, BERT's post-LN layers under other names, and one
bucketed relative-position bias (T5-style buckets) shared by every layer: the ``relative_bucket`` position
scheme with its absolute table on (``absolute: true``).

The shared table lives on the encoder (``encoder.relative_attention_bias``) in both layouts, so the key map
only renames the attention sub-modules and the LM head.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import Family
from bertblocks.families.keymap import KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .fields import HFField
from .roberta import LM_HEAD_RULES, roberta_tokenizer

#: transformers' MPNet computes 32 buckets with distances up to 128, whatever relative_attention_num_buckets says
#: (that field only sizes the table)
BUCKETS, MAX_DISTANCE = 32, 128

_L, _O = "mpnet.encoder.layer.{i}", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="mpnet",
    rules=(
        Rename(f"{_L}.attention.attn.q", f"{_O}.attention.self.query"),
        Rename(f"{_L}.attention.attn.k", f"{_O}.attention.self.key"),
        Rename(f"{_L}.attention.attn.v", f"{_O}.attention.self.value"),
        Rename(f"{_L}.attention.attn.o", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.attention.LayerNorm", f"{_O}.attention.output.LayerNorm"),
        *LM_HEAD_RULES,
    ),
    head_prefixes=("lm_head.", "classifier.", "qa_outputs."),
)


def _from_hf(hf: Any) -> dict[str, Any]:
    src = dict(hf)
    table = src.pop("relative_attention_num_buckets", BUCKETS)
    src.setdefault("pad_token_id", 1)
    src["type_vocab_size"] = 1  # unused: no token-type table
    data = bert_fields_from_hf(src)
    # the scheme (relative buckets over RoBERTa's positions, no token types) is `fixed`, which the translator
    # applies; a position_embedding_type the file may carry says nothing here
    data["position"] = {"table_size": table} if table != BUCKETS else {}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type", "type_vocab_size"))
    options = config.position.options()
    out["relative_attention_num_buckets"] = options.get("table_size") or options.get("num_buckets", BUCKETS)
    return out


#: MPNetConfig's fields: BERT's and the relative bucket table's size
FIELDS = {**BERT_FIELDS, "relative_attention_num_buckets": HFField(int, ge=1)}

MPNET = Family(
    model_type="mpnet",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "MPNetForMaskedLM": "masked_lm_gelu",
        "MPNetForSequenceClassification": {"name": "dense_classification", "activation": "tanh"},
        "MPNetForTokenClassification": "token_classification",
        "MPNetForQuestionAnswering": "question_answering",
        "MPNetForMultipleChoice": "multiple_choice",
    },
    base_architecture="MPNetModel",
    fixed={
        "position.name": "relative_bucket",
        "position.num_buckets": BUCKETS,
        "position.max_distance": MAX_DISTANCE,
        "position.absolute": True,
        "embedding.position_offset": "padding",
        "embedding.token_types": False,
    },
    description="MPNet: RoBERTa positions, no token types, one bucketed relative bias shared by all layers",
    # RoBERTa's framing over a WordPiece vocabulary whose unknown token is BERT's [UNK] (transformers' MPNetTokenizer)
    tokenizer=replace(
        roberta_tokenizer("MPNet"),
        special_tokens={**roberta_tokenizer("MPNet").special_tokens, "unk_token": "[UNK]"},
    ),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "mpnet", lambda **_: MPNET, description=MPNET.description)]
