"""RoFormer (``model_type: roformer``): BERT's post-LN layers with rotary positions instead of a position table.

What differs from BERT, as components: position ``rope`` with ``interleaved: true`` (pairs ``(2i, 2i+1)`` rotated,
``θ_i = 10000^(-2i/d)`` over the whole head) and ``table: sinusoidal`` (RoFormer's fixed sinusoidal table is a frozen
weight of its checkpoint, ``roformer.encoder.embed_positions.weight [max_position_embeddings, d]``: the sines of
the ``d/2`` frequencies, then their cosines; bertblocks keeps it at ``encoder.embed_positions.weight`` and rotates
with the stored values, as transformers does); ``rotary_value: true`` rotates the values too
(``position.rotate_value``); ``embedding_size`` other than ``hidden_size`` narrows the tables and their LayerNorm,
then projects (``roformer.embeddings_project`` ↔ ``bert.embeddings.projection``); no pooler.

Heads: the masked LM (and causal LM) is BERT's ``cls.predictions`` with ``hidden_act`` narrowing to
``embedding_size`` (``masked_lm_gelu``/``causal_lm_gelu`` with ``activation: hidden_act``); the sequence
classifier is ``dropout → dense → hidden_act → dropout → out_proj`` on the first token (``dense_classification``
with ``activation: hidden_act``); the multiple-choice head is transformers' ``RoFormerSequenceSummary`` with
RoFormerConfig's (absent) summary fields: the hidden state at the *last position* of each choice (padding or not;
no projection, no dropout), then ``classifier`` to one score (the ``last_position_multiple_choice`` head).

Differences kept on purpose: ``position_ids`` passed by a user rotate the queries and keys (transformers'
RoFormer ignores them and always uses ``0, 1, …``); RoFormerConfig has no ``classifier_dropout`` (a config.json
that has one keeps it for the round trip, unused, as transformers leaves it unused).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.keymap import KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf, default
from .fields import HFField

#: RoFormerConfig's defaults where they differ from BERT's (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {"vocab_size": 50000, "max_position_embeddings": 1536}
#: transformers' RoFormer language-model classes (their head narrows to embedding_size)
_LANGUAGE_MODELS = {"RoFormerForMaskedLM": "masked_lm_gelu", "RoFormerForCausalLM": "causal_lm_gelu"}
MULTIPLE_CHOICE_HEAD = "last_position_multiple_choice"

KEY_MAP = KeyMap(
    prefix="roformer",
    rules=(Rename("roformer.embeddings_project", "bert.embeddings.projection"),),
    head_prefixes=("cls.", "classifier.", "qa_outputs.", "sequence_summary."),
)

FIXED: dict[str, Any] = {
    "position.name": "rope",
    "position.interleaved": True,
    "position.table": "sinusoidal",
    "position.base": 10000.0,
    "position.rotary_dim": None,
    "position.rotary_fraction": None,
    "embedding.position_offset": "none",
    "encoder.layer.name": "post_ln",
    "pooler": None,
}


def _from_hf(hf: Any) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    embedding_size = src.pop("embedding_size", None)
    rotary_value = src.pop("rotary_value", False)  # a boolean: FIELDS declares it, the translator checks it
    unused = {k: src.pop(k) for k in ("classifier_dropout",) if k in src}  # RoFormerConfig has no such field
    data = bert_fields_from_hf(src)
    data["hf"].update(unused)
    hidden = data.get("hidden_size", default("hidden_size"))
    if embedding_size is not None and embedding_size != hidden:
        data["embedding"] = {**data["embedding"], "embedding_size": embedding_size}
    # the rest of the scheme and no pooler (RoFormerModel has none): FIXED, applied by the translator
    data["position"] = {"rotate_value": rotary_value}
    architectures = hf.get("architectures") or []
    if len(architectures) == 1 and architectures[0] in _LANGUAGE_MODELS:
        head: dict[str, Any] = {"name": _LANGUAGE_MODELS[architectures[0]], "activation": "hidden_act"}
        if embedding_size is not None and embedding_size != hidden:
            head["embedding_size"] = embedding_size
        data["head"] = head
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type", "classifier_dropout"))
    if "classifier_dropout" in config.hf:
        out["classifier_dropout"] = config.hf["classifier_dropout"]
    out["embedding_size"] = config.embedding.options().get("embedding_size") or config.hidden_size
    out["rotary_value"] = bool(config.position.options().get("rotate_value", False))
    return out


#: RoFormerConfig's fields: BERT's, the embedding width and whether values rotate too
FIELDS = {**BERT_FIELDS, "embedding_size": HFField(int, ge=1, nullable=True), "rotary_value": HFField(bool)}

ROFORMER = Family(
    model_type="roformer",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "RoFormerForMaskedLM": {"name": "masked_lm_gelu", "activation": "hidden_act"},
        "RoFormerForCausalLM": {"name": "causal_lm_gelu", "activation": "hidden_act"},
        "RoFormerForSequenceClassification": {"name": "dense_classification", "activation": "hidden_act"},
        "RoFormerForTokenClassification": "token_classification",
        "RoFormerForQuestionAnswering": "question_answering",
        "RoFormerForMultipleChoice": MULTIPLE_CHOICE_HEAD,
    },
    base_architecture="RoFormerModel",
    fixed=FIXED,
    description="RoFormer: post-LN with interleaved rotary positions from a stored sinusoidal table, no pooler",
    # BERT's framing; transformers' RoFormer tokenizers pre-split Chinese with jieba (not part of tokenizer.json)
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=("RoFormerTokenizer", "RoFormerTokenizerFast")),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "roformer", lambda **_: ROFORMER, description=ROFORMER.description)]
