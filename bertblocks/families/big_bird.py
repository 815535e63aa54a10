"""BigBird (``model_type: big_bird``): BERT's post-LN layers with block-sparse attention.

What differs from BERT, as components: the attention is ``block_sparse`` (bertblocks/plugins/block_sparse.py: global
first and last blocks, a window of three blocks and ``num_random_blocks`` random ones, full attention for sequences
of at most ``(5 + 2·num_random_blocks)·block_size`` tokens; ``attention_type: original_full`` is full attention
everywhere; ``use_bias`` is the projections' ``bias`` option); the embeddings drop out *before* their LayerNorm
(``embedding.dropout_before_norm``) and ``rescale_embeddings`` multiplies the token embeddings by √hidden_size
(``embedding.scale_embeddings``); the pooler is stored as ``bert.pooler.{weight,bias}`` (no ``dense``).

Heads: BERT's masked LM, pre-training, causal LM, token classification and multiple choice; the sequence
classifier is ``dropout → dense → hidden_act → dropout → out_proj`` on the first token (``dense_classification`` with
``activation: hidden_act``). transformers' ``BigBirdForQuestionAnswering`` (a feed-forward ``qa_classifier`` and a
question mask found through ``sep_token_id``) is not implemented: such a checkpoint is refused by name.

Differences kept on purpose: transformers switches a model to full attention *for good* the first time it sees a
short sequence (``set_attention_type("original_full")``), bertblocks decides per call; as a decoder (causal or
cached) bertblocks attends causally over every key, where transformers' block-sparse path (past the limit) ignores
causality.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.keymap import KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
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


class BigBirdConfigError(BertBlocksError, ValueError):
    """A big_bird config.json bertblocks cannot represent."""


KEY_MAP = KeyMap(
    prefix="bert",
    rules=(Rename("bert.pooler", "bert.pooler.dense"),),
    head_prefixes=("cls.", "classifier."),
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
    architectures = hf.get("architectures") or []
    if "BigBirdForQuestionAnswering" in architectures:
        raise BigBirdConfigError(
            "architectures: BigBirdForQuestionAnswering is not implemented (its qa_classifier feed-forward and "
            "the question mask found through sep_token_id): load the backbone (BigBirdModel) instead"
        )
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
    },
    base_architecture="BigBirdModel",
    fixed=FIXED,
    description="BigBird: post-LN with block-sparse attention (global, window and random blocks)",
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
