"""Jina-embeddings-v3 (``model_type: jina_embeddings_v3``): XLM-RoBERTa's vocabulary, heads and checkpoint prefix
with rotary positions instead of a position table.

What differs from BERT, as components: position ``rope`` (halves, whole head, ``θ = rope_theta``, 20000 by
default), no position table and no position offset (positions 0, 1, 2, … as transformers' class counts them,
padding included); attention ``fused_qkv`` (with biases); BERT's feed-forward and post-LN layers. Heads are
XLM-RoBERTa's (a gelu ``lm_head``, a ``dense → tanh → out_proj`` classifier).

The checkpoint is what transformers writes (its ``save_pretrained`` reverts to Jina's original names):
``roberta.emb_ln``, ``roberta.encoder.layers.{i}.mixer.Wqkv`` (query, key, value rows), ``mixer.out_proj``,
``norm1``, ``mlp.fc1``, ``mlp.fc2``, ``norm2``; one under transformers' in-memory names
(``save_original_format=False``: ``layers.{i}.self_attn.q_proj``, …) loads too. The published model's task
LoRA adapters are not part of transformers' class and not of this family.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import Family
from bertblocks.families.keymap import Join, KeyMap, Rename

from ._rotary_config import ROPE_FIXED, rope_from_hf, rope_to_hf
from .bertlike import bert_fields_from_hf, bert_fields_to_hf
from .roberta import LM_HEAD_RULES, roberta_tokenizer

#: transformers' JinaEmbeddingsV3Config.default_theta
DEFAULT_THETA = 20000.0
#: JinaEmbeddingsV3Config's defaults where they differ from BERT's (a config.json may leave them out)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 250002,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
}

_L, _N, _O = "roberta.encoder.layers.{i}", "roberta.layers.{i}", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="roberta",
    rules=(
        Rename("roberta.emb_ln", "bert.embeddings.LayerNorm"),
        Rename(f"{_L}.mixer.Wqkv", f"{_O}.attention.self.Wqkv"),
        Rename(f"{_L}.mixer.out_proj", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.norm1", f"{_O}.attention.output.LayerNorm"),
        Rename(f"{_L}.mlp.fc1", f"{_O}.intermediate.dense"),
        Rename(f"{_L}.mlp.fc2", f"{_O}.output.dense"),
        Rename(f"{_L}.norm2", f"{_O}.output.LayerNorm"),
        *LM_HEAD_RULES,
        # transformers' own names, in checkpoints saved with save_original_format=False: read, never written
        # (the rules above match every model key first)
        Join(tuple(f"{_N}.self_attn.{p}_proj" for p in "qkv"), f"{_O}.attention.self.Wqkv"),
        Rename(f"{_N}.self_attn.o_proj", f"{_O}.attention.output.dense"),
        Rename(f"{_N}.post_attention_layernorm", f"{_O}.attention.output.LayerNorm"),
        Rename(f"{_N}.mlp.fc1", f"{_O}.intermediate.dense"),
        Rename(f"{_N}.mlp.fc2", f"{_O}.output.dense"),
        Rename(f"{_N}.post_mlp_layernorm", f"{_O}.output.LayerNorm"),
    ),
    head_prefixes=("lm_head.", "classifier.", "qa_outputs."),
)

FIXED: dict[str, Any] = {
    **ROPE_FIXED,
    "encoder.layer.name": "post_ln",
    "encoder.attention.name": "bert",
    "encoder.attention.fused_qkv": True,
    "encoder.attention.qkv_bias": True,
    "encoder.attention.output_bias": True,
    "encoder.feedforward.name": "bert",
    "encoder.feedforward.bias": True,
    "is_decoder": False,
    "add_cross_attention": False,
}


def _from_hf(hf: Any) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    position = rope_from_hf(src, DEFAULT_THETA)
    for absent in ("is_decoder", "add_cross_attention"):  # JinaEmbeddingsV3Config has neither
        src.pop(absent, None)
    data = bert_fields_from_hf(src)
    data["position"] = position
    encoder = data["encoder"]
    encoder["attention"] = {**encoder["attention"], "fused_qkv": True}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type", "is_decoder", "add_cross_attention"))
    out.update(rope_to_hf(config))
    return out


JINA_EMBEDDINGS_V3 = Family(
    model_type="jina_embeddings_v3",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    key_map=KEY_MAP,
    architectures={
        "JinaEmbeddingsV3ForMaskedLM": "masked_lm_gelu",
        "JinaEmbeddingsV3ForSequenceClassification": {"name": "dense_classification", "activation": "tanh"},
        "JinaEmbeddingsV3ForTokenClassification": "token_classification",
        "JinaEmbeddingsV3ForQuestionAnswering": "question_answering",
    },
    base_architecture="JinaEmbeddingsV3Model",
    fixed=FIXED,
    description="Jina-embeddings-v3: XLM-RoBERTa with RoPE instead of a position table, fused QKV",
    # transformers maps jina_embeddings_v3 to XLMRobertaTokenizer; chosen by model_type only (the xlm-roberta
    # family claims that class name)
    tokenizer=replace(roberta_tokenizer("XLMRoberta"), tokenizer_classes=()),
)


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "family",
            "jina_embeddings_v3",
            lambda **_: JINA_EMBEDDINGS_V3,
            description=JINA_EMBEDDINGS_V3.description,
        )
    ]
