"""ALBERT: factorized embeddings (``embedding_size`` then ``embedding_hidden_mapping_in``), layer groups whose
weights every layer of the group uses, BERT's post-LN layer under other names, a masked LM at ``embedding_size``
and a sentence-order pre-training head.

The layer groups are the encoder's own cross-layer sharing (``encoder.num_layer_groups`` = ALBERT's
``num_hidden_groups``): group ``g`` is held once, at ``encoder.layer.g``, as ALBERT stores it at
``albert_layer_groups.g.albert_layers.0``, so the key map only renames.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.keymap import KeyMap, Rename

from ..errors import InputError
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .fields import HFField

_G = "albert.encoder.albert_layer_groups.{g}.albert_layers.0"
_O = "bert.encoder.layer.{g}"
KEY_MAP = KeyMap(
    prefix="albert",
    rules=(
        Rename(f"{_G}.attention.query", f"{_O}.attention.self.query"),
        Rename(f"{_G}.attention.key", f"{_O}.attention.self.key"),
        Rename(f"{_G}.attention.value", f"{_O}.attention.self.value"),
        Rename(f"{_G}.attention.dense", f"{_O}.attention.output.dense"),
        Rename(f"{_G}.attention.LayerNorm", f"{_O}.attention.output.LayerNorm"),
        Rename(f"{_G}.ffn", f"{_O}.intermediate.dense"),
        Rename(f"{_G}.ffn_output", f"{_O}.output.dense"),
        Rename(f"{_G}.full_layer_layer_norm", f"{_O}.output.LayerNorm"),
        Rename("albert.encoder.embedding_hidden_mapping_in", "bert.embeddings.projection"),
        Rename("albert.pooler", "bert.pooler.dense"),
        Rename("predictions.dense", "cls.predictions.transform.dense"),
        Rename("predictions.LayerNorm", "cls.predictions.transform.LayerNorm"),
        Rename("predictions.decoder", "cls.predictions.decoder"),
        Rename("predictions.bias", "cls.predictions.bias"),
    ),
    head_prefixes=("predictions.", "sop_classifier.", "classifier.", "qa_outputs."),
)


def _from_hf(hf: Any) -> dict[str, Any]:
    src = dict(hf)
    if src.pop("inner_group_num", 1) != 1:
        # several distinct layers inside one group: no published ALBERT has them, and the encoder's groups hold one
        raise InputError(
            f"inner_group_num must be 1 (one layer per group, as every published ALBERT); got {hf['inner_group_num']}"
        )
    groups = src.pop("num_hidden_groups", 1)
    embedding_size = src.pop("embedding_size", 128)
    src.setdefault("hidden_act", "gelu_new")  # AlbertConfig's defaults differ from BERT's
    src.setdefault("hidden_dropout_prob", 0.0)
    src.setdefault("attention_probs_dropout_prob", 0.0)
    # AlbertConfig's classifier dropout is its own field with its own default (not hidden_dropout_prob's)
    src["classifier_dropout"] = src.pop("classifier_dropout_prob", 0.1)
    data = bert_fields_from_hf(src)
    data["embedding"] = {**data["embedding"], "embedding_size": embedding_size}
    # ALBERT's layer i uses group int(i / (layers / groups)): the encoder's i · groups // layers
    data["encoder"] = {**data["encoder"], "num_layer_groups": groups}
    lm = {"embedding_size": embedding_size, "activation": "hidden_act"}
    architectures = hf.get("architectures") or []
    if architectures == ["AlbertForMaskedLM"]:
        data["head"] = {"name": "masked_lm_gelu", **lm}
    elif architectures == ["AlbertForPreTraining"]:
        data["head"] = {"name": "sentence_order_pretraining", **lm}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    out["embedding_size"] = config.embedding.options().get("embedding_size") or config.hidden_size
    out["classifier_dropout_prob"] = out.pop("classifier_dropout", None)
    if out["classifier_dropout_prob"] is None:
        out["classifier_dropout_prob"] = 0.1
    out["num_hidden_groups"] = config.encoder.num_layer_groups or config.encoder.num_layers
    out["inner_group_num"] = 1
    return out


#: AlbertConfig's fields: BERT's, the factorized embedding, layer groups and its classifier dropout
FIELDS = {
    **BERT_FIELDS,
    "embedding_size": HFField(int, ge=1),
    "num_hidden_groups": HFField(int, ge=1),
    "inner_group_num": HFField(int, ge=1),
    "classifier_dropout_prob": HFField(float, ge=0, le=1, nullable=True),
}

ALBERT = Family(
    model_type="albert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "AlbertForPreTraining": "sentence_order_pretraining",
        "AlbertForMaskedLM": "masked_lm_gelu",
        "AlbertForSequenceClassification": "sequence_classification",
        "AlbertForTokenClassification": "token_classification",
        "AlbertForQuestionAnswering": "question_answering",
        "AlbertForMultipleChoice": "multiple_choice",
    },
    base_architecture="AlbertModel",
    fixed={"position.name": "absolute"},
    description="ALBERT: factorized embeddings, layer groups shared by their layers, sentence-order pre-training",
    # BERT's framing over a SentencePiece vocabulary whose padding and unknown tokens are <pad> and <unk>
    tokenizer=replace(
        BERT_TOKENIZER,
        special_tokens={**BERT_TOKENIZER.special_tokens, "pad_token": "<pad>", "unk_token": "<unk>"},
        model_input_names=("input_ids", "attention_mask"),  # as transformers' AlbertTokenizer returns
        tokenizer_classes=("AlbertTokenizer", "AlbertTokenizerFast"),
    ),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "albert", lambda **_: ALBERT, description=ALBERT.description)]
