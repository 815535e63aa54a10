"""RemBERT (``model_type: rembert``): BERT's post-LN layers with *decoupled* input and output embeddings.

The token, position and token-type tables are ``input_embedding_size`` wide (256 in google/rembert) and normalised
at that width; ``encoder.embedding_hidden_mapping_in`` projects them to the hidden size (bertblocks' embedding
``embedding_size`` with its ``projection``, as ALBERT's). The language-model heads narrow to a second, larger
width, ``output_embedding_size`` (1664): ``dense → hidden_act → LayerNorm`` at that width, then a decoder with its
own weight and bias onto the vocabulary (``masked_lm_gelu``/``causal_lm_gelu`` with ``embedding_size`` and
``activation: hidden_act``). The output embeddings are never tied to the input ones: transformers' RemBERT classes
declare no tied weights whatever ``tie_word_embeddings`` says, so the family fixes ``tie_word_embeddings: false``.
The classification heads are BERT's, on the pooled first token, with RemBERT's ``classifier_dropout_prob``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .family import BERT_TOKENIZER, Family
from .fields import HFField
from .keymap import AbsentBias, KeyMap, Rename

#: RemBertConfig's defaults where they differ from BERT's (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 250300,
    "hidden_size": 1152,
    "num_hidden_layers": 32,
    "num_attention_heads": 18,
    "intermediate_size": 4608,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
#: RemBertConfig's defaults of its own fields
INPUT_EMBEDDING_SIZE = 256
OUTPUT_EMBEDDING_SIZE = 1664
CLASSIFIER_DROPOUT = 0.1
#: transformers' RemBERT language-model classes → the head each means (its options come from the config.json)
_LANGUAGE_MODELS = {"RemBertForMaskedLM": "masked_lm_gelu", "RemBertForCausalLM": "causal_lm_gelu"}

KEY_MAP = KeyMap(
    prefix="rembert",
    rules=(
        Rename("rembert.encoder.embedding_hidden_mapping_in", "bert.embeddings.projection"),
        # RemBertLMPredictionHead: dense, LayerNorm and decoder side by side (no `transform` module)
        Rename("cls.predictions.dense", "cls.predictions.transform.dense"),
        Rename("cls.predictions.LayerNorm", "cls.predictions.transform.LayerNorm"),
        # the untied decoder owns its bias (cls.predictions.decoder.bias); RemBERT stores no separate one
        AbsentBias("cls.predictions.bias"),
    ),
    head_prefixes=("cls.", "classifier.", "qa_outputs."),
)

FIXED: dict[str, Any] = {"position.name": "absolute", "tie_word_embeddings": False}


def _from_hf(hf: Any) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    input_size = src.pop("input_embedding_size", INPUT_EMBEDDING_SIZE)
    output_size = src.pop("output_embedding_size", OUTPUT_EMBEDDING_SIZE)
    # RemBERT's classifier dropout is its own field with its own default (not hidden_dropout_prob's)
    src["classifier_dropout"] = src.pop("classifier_dropout_prob", CLASSIFIER_DROPOUT)
    tie = src.pop("tie_word_embeddings", False)
    data = bert_fields_from_hf(src)
    # the input tables are input_embedding_size wide and always projected (a set embedding_size projects even at
    # the hidden width, as RemBertEncoder always has embedding_hidden_mapping_in)
    data["embedding"] = {**data["embedding"], "embedding_size": input_size}
    # transformers ties nothing in RemBERT, whatever the field says (FIXED: tie_word_embeddings false)
    if tie:
        data["hf"]["tie_word_embeddings"] = tie  # written back as found, though it changes nothing
    # the output width lives in the head; a backbone keeps it for the round trip
    data["hf"]["output_embedding_size"] = output_size
    architectures = hf.get("architectures") or []
    if len(architectures) == 1 and architectures[0] in _LANGUAGE_MODELS:
        hidden = data.get("hidden_size", DEFAULTS["hidden_size"])
        data["head"] = {
            "name": _LANGUAGE_MODELS[architectures[0]],
            # the head's transform narrows (or widens) to the output width; at the hidden width it need not say so
            "embedding_size": output_size if output_size != hidden else None,
            "activation": "hidden_act",
        }
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    out["input_embedding_size"] = config.embedding.options().get("embedding_size") or config.hidden_size
    if config.head is not None and config.head.name in _LANGUAGE_MODELS.values():
        # a language-model head: its width is the output embedding size (the hidden size when it does not narrow)
        out["output_embedding_size"] = config.head.options().get("embedding_size") or config.hidden_size
    else:
        out["output_embedding_size"] = config.hf.get("output_embedding_size", OUTPUT_EMBEDDING_SIZE)
    out["tie_word_embeddings"] = config.hf.get("tie_word_embeddings", False)
    dropout = out.pop("classifier_dropout", None)
    out["classifier_dropout_prob"] = CLASSIFIER_DROPOUT if dropout is None else dropout
    return out


#: RemBertConfig's fields: BERT's, the two embedding widths and its classifier dropout
FIELDS = {
    **BERT_FIELDS,
    "input_embedding_size": HFField(int, ge=1),
    "output_embedding_size": HFField(int, ge=1),
    "classifier_dropout_prob": HFField(float, ge=0, le=1, nullable=True),
}

REMBERT = Family(
    model_type="rembert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    example_config={
        "input_embedding_size": 16,
        "output_embedding_size": 24,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 37,
        "vocab_size": 99,
    },
    key_map=KEY_MAP,
    architectures={
        "RemBertForMaskedLM": {"name": "masked_lm_gelu", "activation": "hidden_act"},
        "RemBertForCausalLM": {"name": "causal_lm_gelu", "activation": "hidden_act"},
        "RemBertForSequenceClassification": "sequence_classification",
        "RemBertForTokenClassification": "token_classification",
        "RemBertForQuestionAnswering": "question_answering",
        "RemBertForMultipleChoice": "multiple_choice",
    },
    base_architecture="RemBertModel",
    fixed=FIXED,
    description="RemBERT: narrow input embeddings projected to hidden, a wider untied output embedding in its LM head",
    # BERT's framing over a SentencePiece vocabulary whose padding and unknown tokens are <pad> and <unk>
    tokenizer=replace(
        BERT_TOKENIZER,
        special_tokens={**BERT_TOKENIZER.special_tokens, "pad_token": "<pad>", "unk_token": "<unk>"},
        model_input_names=("input_ids", "attention_mask"),  # as transformers' RemBertTokenizer returns
        tokenizer_classes=("RemBertTokenizer", "RemBertTokenizerFast"),
    ),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "rembert", lambda **_: REMBERT, description=REMBERT.description)]
