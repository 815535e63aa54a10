"""BertGeneration (``model_type: bert-generation``): BERT as the encoder and the decoder of a sequence-to-sequence
model (Rothe et al. 2020, "Leveraging Pre-trained Checkpoints for Sequence Generation Tasks").

Composition: BERT's post-LN layers and learned absolute positions, embeddings without token types
(``embedding.token_types: false``: BertGenerationConfig has no ``type_vocab_size``) and no pooler. transformers'
classes: ``BertGenerationEncoder`` (the backbone; with ``is_decoder`` causal, with ``add_cross_attention`` the
decoder's cross-attention, and a key/value cache as BERT's decoder has) and ``BertGenerationDecoder`` (the
backbone and one linear map onto the vocabulary, tied to the embeddings: head ``causal_lm_linear``). Both are the
sides of transformers' ``EncoderDecoderModel`` for the published BBC, CNN/DailyMail, Gigaword, WMT and Discofuse
checkpoints (:class:`bertblocks.models.encoder_decoder.BertEncoderDecoder` builds them so).

The checkpoint: prefix ``bert.`` (BERT's layout inside); ``lm_head.decoder`` ↔ ``decoder``, and the decoder's bias
``lm_head.bias`` (transformers ties ``lm_head.decoder.bias`` to it) ↔ ``decoder.bias``.

Refused, naming the field: ``tie_word_embeddings: false`` for ``BertGenerationDecoder`` (read and written):
transformers then unties the decoder's bias from ``lm_head.bias`` too and stores both, the second unused, which
the key map cannot tell apart from the tied layout. The published checkpoints tie.

Tokenizer: BertGenerationTokenizer is a SentencePiece model (``spiece.model``) that adds no special tokens; bertblocks
reads a ``tokenizer.json`` (the convention frames nothing: ``$A``, ``$A $B``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .family import Family, TokenizerConvention
from .keymap import BACKBONE_PREFIX, KeyMap, Rename

MODEL_TYPE = "bert-generation"
#: BertGenerationConfig's defaults where they differ from BERT's (a config.json without the field means these:
#: the published L-24 checkpoints' dimensions and vocabulary)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50358,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
}
KEY_MAP = KeyMap(
    prefix=BACKBONE_PREFIX,
    # the bias first: saved, the decoder's bias is lm_head.bias, the tensor transformers stores
    rules=(Rename("lm_head.bias", "decoder.bias"), Rename("lm_head.decoder", "decoder")),
    head_prefixes=("lm_head.",),
)
FIXED: dict[str, Any] = {
    "position.name": "absolute",
    "embedding.token_types": False,
    "pooler": None,
    "encoder.layer.name": "post_ln",
}

#: BertGenerationConfig's fields: BERT's without token types and position_embedding_type
FIELDS = {
    name: spec for name, spec in BERT_FIELDS.items() if name not in ("type_vocab_size", "position_embedding_type")
}

#: transformers' BertGenerationTokenizer's specials (its separator is ``<::::>``); it has no class token and no mask
#: token, which bertblocks' tokenizer holds ids of: the start token ``<s>`` stands for the first, ``<unk>`` for the
#: second (BertGeneration has no masked-LM class that would read it)
BERT_GENERATION_TOKENIZER = TokenizerConvention(
    special_tokens={
        "unk_token": "<unk>",
        "sep_token": "<::::>",
        "pad_token": "<pad>",
        "cls_token": "<s>",
        "mask_token": "<unk>",
    },
    single="$A",
    pair="$A $B",
    model_input_names=("input_ids", "attention_mask"),
    tokenizer_classes=("BertGenerationTokenizer",),
)


class BertGenerationConfigError(BertBlocksError, ValueError):
    """A BertGeneration ``config.json`` (or a config to write as one) that bertblocks cannot represent."""


_UNTIED = (
    "tie_word_embeddings=False is not supported for BertGenerationDecoder: transformers then stores the decoder's "
    "bias twice (lm_head.decoder.bias, read, and lm_head.bias, unread), a layout the key map does not tell apart "
    "from the tied one"
)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    if hf.get("tie_word_embeddings") is False and hf.get("architectures") == ["BertGenerationDecoder"]:
        raise BertGenerationConfigError(f"{MODEL_TYPE} config.json: {_UNTIED}")
    data = bert_fields_from_hf({**DEFAULTS, **hf})
    # no token types, no pooler: Family.fixed, applied by the translator
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    if config.head is not None and not config.tie_word_embeddings:
        raise BertGenerationConfigError(f"cannot write a {MODEL_TYPE} config.json: {_UNTIED}")
    return bert_fields_to_hf(config, dropped=("position_embedding_type", "type_vocab_size"))


BERT_GENERATION = Family(
    model_type=MODEL_TYPE,
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={"BertGenerationDecoder": "causal_lm_linear"},
    base_architecture="BertGenerationEncoder",
    fixed=FIXED,
    description="BertGeneration: BERT without token types or pooler, as encoder and decoder of a seq2seq model",
    tokenizer=BERT_GENERATION_TOKENIZER,
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", MODEL_TYPE, lambda **_: BERT_GENERATION, description=BERT_GENERATION.description)]
