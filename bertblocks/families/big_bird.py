"""BigBird (``model_type: big_bird``): BERT's post-LN layers with block-sparse attention.

What differs from BERT, as components: the attention is ``block_sparse`` (bertblocks/plugins/block_sparse.py: global
first and last blocks, a window of three blocks and ``num_random_blocks`` random ones, full attention for sequences
of at most ``(5 + 2·num_random_blocks)·block_size`` tokens; ``attention_type: original_full`` is full attention
everywhere; ``use_bias`` is the projections' ``bias`` option); the embeddings drop out *before* their LayerNorm
(``embedding.dropout_before_norm``) and ``rescale_embeddings`` multiplies the token embeddings by √hidden_size
(``embedding.scale_embeddings``); the pooler is stored as ``bert.pooler.{weight,bias}`` (no ``dense``).

Heads: BERT's masked LM, pre-training, causal LM, token classification and multiple choice; the sequence
classifier is ``dropout → dense → hidden_act → dropout → out_proj`` on the first token (``dense_classification`` with
``activation: hidden_act``); question answering is ``feedforward_question_answering`` (transformers'
``BigBirdForQuestionAnsweringHead``: a feed-forward block under ``qa_classifier`` before ``qa_outputs``), on a
backbone without a pooler (``add_pooling_layer=False``, unlike every other BigBird class). As
``BigBirdForQuestionAnswering`` does, a call without ``question_lengths`` takes the question to end at the first
``sep_token_id`` of ``input_ids`` (:data:`QA_DEFAULTS`), removes those tokens from the span's competition and, without
``token_type_ids``, gives the question type 0 and the rest type 1.

Differences kept on purpose: transformers switches a model to full attention *for good* the first time it sees a
short sequence (``set_attention_type("original_full")``), bertblocks decides per call; as a decoder (causal or
cached) bertblocks attends causally over every key, where transformers' block-sparse path (past the limit) ignores
causality.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.keymap import KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf, token_id
from .fields import HFField

#: BigBirdConfig's defaults where they differ from BERT's (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50358,
    "hidden_act": "gelu_new",
    "max_position_embeddings": 4096,
    "attention_type": "block_sparse",
    "block_size": 64,
    "num_random_blocks": 3,
    "use_bias": True,
    "rescale_embeddings": False,
}
#: BigBirdConfig's default ``sep_token_id`` (a config.json without the field means it)
SEP_TOKEN_ID = 66


KEY_MAP = KeyMap(
    prefix="bert",
    rules=(Rename("bert.pooler", "bert.pooler.dense"),),
    head_prefixes=("cls.", "classifier.", "qa_classifier."),
)

FIXED: dict[str, Any] = {
    "position.name": "absolute",
    "embedding.position_offset": "none",
    "embedding.dropout_before_norm": True,
    "encoder.layer.name": "post_ln",
    "encoder.attention.name": "block_sparse",
    "pooler.always": True,  # every BigBirdFor… class builds BigBirdModel with its pooler
}


def _from_hf(hf: Any) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    attention = {  # the attention's name, dropout before the norm and the pooler: FIXED (applied by the translator)
        "attention_type": src.pop("attention_type"),
        "block_size": src.pop("block_size"),
        "num_random_blocks": src.pop("num_random_blocks"),
        "bias": src.pop("use_bias"),
    }
    rescale = src.pop("rescale_embeddings")
    data = bert_fields_from_hf(src)
    data["encoder"]["attention"].update(attention)
    data["embedding"].update({"scale_embeddings": rescale})
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    spec = config.encoder.attention
    attention = spec.options()
    if spec.name != "block_sparse":
        # another attention (BERT's) is full attention: the nearest this format says; what differs (the
        # attention's name) the translator writes under `bertblocks`
        attention = {"attention_type": "original_full", "bias": attention.get("qkv_bias", True)}
    out["attention_type"] = attention["attention_type"]
    out["block_size"] = attention.get("block_size", DEFAULTS["block_size"])
    out["num_random_blocks"] = attention.get("num_random_blocks", DEFAULTS["num_random_blocks"])
    out["use_bias"] = attention["bias"]
    out["rescale_embeddings"] = bool(config.embedding.options().get("scale_embeddings", False))
    return out


def _question_lengths(inputs: Mapping[str, torch.Tensor | None], config: BertConfig) -> torch.Tensor | None:
    """``BigBirdForQuestionAnswering``'s ``question_lengths [b, 1]`` when none is given: up to and including the first
    ``sep_token_id`` of each row (``<cls> question <sep> context <sep>``); a row without one gets 1. Nothing without
    ``input_ids``."""
    ids = inputs.get("input_ids")
    if ids is None:
        return None
    sep = token_id(config, "sep_token_id", SEP_TOKEN_ID)
    return (ids.eq(sep).int().argmax(dim=-1) + 1).unsqueeze(1)  # [b, 1]


def _question_token_types(inputs: Mapping[str, torch.Tensor | None], config: BertConfig) -> torch.Tensor | None:
    """``BigBirdForQuestionAnswering``'s token types when none are given: 0 for the question (its first
    ``question_lengths`` tokens), 1 for the rest, padding included."""
    lengths, ids, embeds = inputs.get("question_lengths"), inputs.get("input_ids"), inputs.get("inputs_embeds")
    shape = tuple(ids.shape) if ids is not None else tuple(embeds.shape[:-1]) if embeds is not None else None
    if lengths is None or shape is None or lengths.numel() != shape[0]:
        return None  # lengths of another shape: the head refuses them, naming question_lengths
    positions = torch.arange(shape[-1], device=lengths.device)  # [q]
    return (positions >= lengths.reshape(-1, 1)).long()  # [b, q]


#: what ``BigBirdForQuestionAnswering`` makes itself when a call leaves it out: the question's length, then the
#: token types (read from it, given or made)
QA_DEFAULTS = {"question_lengths": _question_lengths, "token_type_ids": _question_token_types}


#: BigBirdConfig's fields: BERT's (no position_embedding_type) and its own
FIELDS = {
    **{k: v for k, v in BERT_FIELDS.items() if k != "position_embedding_type"},
    "attention_type": HFField(str, choices=("block_sparse", "original_full")),
    "block_size": HFField(int, ge=1),
    "num_random_blocks": HFField(int, ge=0),
    "use_bias": HFField(bool),
    "rescale_embeddings": HFField(bool),
    "sep_token_id": HFField(int, ge=0, nullable=True),
    "bos_token_id": HFField(int, ge=0, nullable=True),
    "eos_token_id": HFField(int, ge=0, nullable=True),
}

BIG_BIRD = Family(
    model_type="big_bird",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "BigBirdForMaskedLM": "masked_lm",
        "BigBirdForPreTraining": "pretraining",
        "BigBirdForCausalLM": "causal_lm",
        "BigBirdForSequenceClassification": {"name": "dense_classification", "activation": "hidden_act"},
        "BigBirdForTokenClassification": "token_classification",
        "BigBirdForMultipleChoice": "multiple_choice",
        "BigBirdForQuestionAnswering": "feedforward_question_answering",
    },
    base_architecture="BigBirdModel",
    fixed=FIXED,
    description="BigBird: post-LN with block-sparse attention (global, window and random blocks)",
    input_defaults={"feedforward_question_answering": QA_DEFAULTS},
    # transformers' BigBirdTokenizer: SentencePiece specials, [CLS] A [SEP] (B [SEP]) framing, no token types returned
    tokenizer=replace(
        BERT_TOKENIZER,
        special_tokens={
            "unk_token": "<unk>",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "sep_token": "[SEP]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        },
        model_input_names=("input_ids", "attention_mask"),
        tokenizer_classes=("BigBirdTokenizer", "BigBirdTokenizerFast"),
    ),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "big_bird", lambda **_: BIG_BIRD, description=BIG_BIRD.description)]
