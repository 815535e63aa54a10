"""ELECTRA: BERT layers under ``electra.``, embeddings of ``embedding_size`` projected to the hidden size
(``embeddings_project``), no pooler; heads: the discriminator (replaced-token detection), the generator
(a gelu masked LM at ``embedding_size``), a ``dense → gelu → out_proj`` classifier and a summary-based
multiple-choice head."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.keymap import KeyMap, Rename

from ..errors import InputError
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf, default
from .fields import HFField

_MC = ("dense_multiple_choice",)
KEY_MAP = KeyMap(
    prefix="electra",
    rules=(
        Rename("electra.embeddings_project", "bert.embeddings.projection"),
        Rename("generator_predictions.dense", "cls.predictions.transform.dense"),
        Rename("generator_predictions.LayerNorm", "cls.predictions.transform.LayerNorm"),
        Rename("generator_lm_head.weight", "cls.predictions.decoder.weight"),
        Rename("generator_lm_head.bias", "cls.predictions.bias"),
        # ElectraForMultipleChoice: ElectraSequenceSummary's projection, then a 1-output classifier
        Rename("sequence_summary.summary", "classifier.dense", heads=_MC),
        Rename("classifier", "classifier.out_proj", heads=_MC),
    ),
    head_prefixes=(
        "discriminator_predictions.",
        "generator_predictions.",
        "generator_lm_head.",
        "classifier.",
        "qa_outputs.",
        "sequence_summary.",
    ),
)
_GENERATORS = ("ElectraForMaskedLM", "ElectraForCausalLM")


def _from_hf(hf: Any) -> dict[str, Any]:
    src = dict(hf)
    embedding_size = src.pop("embedding_size", None)
    for key in ("summary_type", "summary_use_proj", "summary_activation"):
        expected = {"summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu"}[key]
        if src.get(key, expected) != expected:
            raise InputError(f"{key} is {src[key]!r}; bertblocks' ELECTRA multiple-choice head needs {expected!r}")
    data = bert_fields_from_hf(src)
    hidden = data.get("hidden_size", default("hidden_size"))
    if embedding_size is not None and embedding_size != hidden:
        data["embedding"] = {**data["embedding"], "embedding_size": embedding_size}
    architectures = hf.get("architectures") or []
    if len(architectures) == 1 and architectures[0] in _GENERATORS:
        name = "masked_lm_gelu" if architectures[0] == "ElectraForMaskedLM" else "causal_lm_gelu"
        data["head"] = {"name": name, "embedding_size": embedding_size}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    out["embedding_size"] = config.embedding.options().get("embedding_size") or config.hidden_size
    return out


#: ElectraConfig's fields: BERT's, the embedding width and the multiple-choice summary (one value each works)
FIELDS = {
    **BERT_FIELDS,
    "embedding_size": HFField(int, ge=1, nullable=True),
    "summary_type": HFField(str),
    "summary_use_proj": HFField(bool),
    "summary_activation": HFField(str, nullable=True),
    "summary_last_dropout": HFField(float, ge=0, le=1),
}

ELECTRA = Family(
    model_type="electra",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "ElectraForPreTraining": "replaced_token_detection",
        "ElectraForMaskedLM": "masked_lm_gelu",
        "ElectraForCausalLM": "causal_lm_gelu",
        "ElectraForSequenceClassification": {"name": "dense_classification", "activation": "gelu"},
        "ElectraForTokenClassification": "token_classification",
        "ElectraForQuestionAnswering": "question_answering",
        "ElectraForMultipleChoice": {"name": "dense_multiple_choice", "activation": "gelu"},
    },
    base_architecture="ElectraModel",
    fixed={"position.name": "absolute", "pooler": None},
    description="ELECTRA: embedding_size projected to hidden, no pooler, discriminator and generator heads",
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=("ElectraTokenizer", "ElectraTokenizerFast")),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "electra", lambda **_: ELECTRA, description=ELECTRA.description)]
