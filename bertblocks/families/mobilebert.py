"""MobileBERT (``model_type: mobilebert``): a narrow, deep BERT whose layers squeeze a wide residual stream through a
bottleneck (Sun et al. 2020), in transformers' ``MobileBert*`` classes.

Composition (the components live in :mod:`bertblocks.plugins.bottleneck` and :mod:`bertblocks.plugins.norms`):

* embedding ``trigram``: a ``embedding_size``-wide token table, each token concatenated with its neighbours
  (``trigram_input``), projected to ``hidden_size`` (``embedding_transformation``); hidden-wide position and
  token-type tables; the norm (``normalization_type``: ``no_norm`` or ``layer_norm``, torch's epsilon 1e-5 as
  transformers builds it there);
* layer ``bottleneck`` (``use_bottleneck``, ``intra_bottleneck_size``, ``key_query_shared_bottleneck``,
  ``use_bottleneck_attention``, ``num_feedforward_networks``) with ``encoder.norm`` ``no_norm`` or ``layernorm``
  (``normalization_type``); with the query/key bottleneck the values read the full input
  (``encoder.attention.value_input_size: hidden_size``);
* BERT's pooler (``classifier_activation: true``) or the first token as it is (``false``); BERT's classification,
  token, QA, multiple-choice and next-sentence heads; the masked LM and pre-training heads are
  ``bottleneck_masked_lm`` / ``bottleneck_pretraining`` (the decoder tied to the narrow table,
  ``cls.predictions.dense`` supplying the rest of the hidden width).

Checkpoint keys are transformers' under the prefix ``mobilebert.`` (bertblocks' own are ``bert.``); nothing else is
renamed. ``true_hidden_size`` (written by transformers, derived from the others) is checked, not stored.
``classifier_activation`` picks the pooler: BERT's ``first_token`` (dense and tanh) or ``first_token_plain`` (the first
token as it is: google/mobilebert-uncased's choice). Refused: a bottleneck without the query/key bottleneck or
bottleneck attention (transformers cannot build it either).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component

from ..errors import BertBlocksError
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .family import BERT_TOKENIZER, Family
from .fields import HFField
from .keymap import KeyMap

MODEL_TYPE = "mobilebert"
#: MobileBertConfig's defaults where they differ from bertblocks' (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {
    "hidden_size": 512,
    "num_hidden_layers": 24,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "hidden_act": "relu",
    "hidden_dropout_prob": 0.0,
    "embedding_size": 128,
    "trigram_input": True,
    "use_bottleneck": True,
    "intra_bottleneck_size": 128,
    "use_bottleneck_attention": False,
    "key_query_shared_bottleneck": True,
    "num_feedforward_networks": 4,
    "normalization_type": "no_norm",
    "classifier_activation": True,
}
#: the epsilon transformers' MobileBERT gives the embedding norm and each layer's output.LayerNorm (torch's default:
#: it builds them without layer_norm_eps)
TORCH_EPS = 1e-5
_NORMS = {"no_norm": "no_norm", "layer_norm": "layernorm"}
#: transformers' language-model classes → bertblocks' head (the head's embedding_size is the config's)
_LANGUAGE_MODELS = {
    "MobileBertForMaskedLM": "bottleneck_masked_lm",
    "MobileBertForPreTraining": "bottleneck_pretraining",
}

KEY_MAP = KeyMap(prefix=MODEL_TYPE, head_prefixes=("cls.", "classifier.", "qa_outputs."))

FIXED: dict[str, Any] = {
    "position.name": "absolute",
    "embedding.name": "trigram",
    "embedding.norm_eps": TORCH_EPS,
    "encoder.layer.name": "bottleneck",
    "encoder.layer.output_norm_eps": TORCH_EPS,
    "encoder.attention.name": "bert",
    "is_decoder": False,
    "add_cross_attention": False,
}


class MobileBertConfigError(BertBlocksError, ValueError):
    """A mobilebert config.json bertblocks cannot represent."""


def _refuse(field: str, value: Any, why: str) -> MobileBertConfigError:
    return MobileBertConfigError(f"{MODEL_TYPE} config.json: {field}={value!r} is not supported: {why}")


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    hidden = src["hidden_size"]
    embedding_size = src.pop("embedding_size")
    trigram = src.pop("trigram_input")
    use_bottleneck = src.pop("use_bottleneck")
    intra = src.pop("intra_bottleneck_size")
    bottleneck_attention = src.pop("use_bottleneck_attention")
    shared = src.pop("key_query_shared_bottleneck")
    ffns = src.pop("num_feedforward_networks")
    norm = _NORMS.get(src.pop("normalization_type"), "layernorm")  # FIELDS restricts the values
    true_hidden = src.pop("true_hidden_size", None)
    expected = intra if use_bottleneck else hidden
    if true_hidden is not None and true_hidden != expected:
        raise _refuse("true_hidden_size", true_hidden, f"transformers derives it: {expected} here")
    if use_bottleneck and not (bottleneck_attention or shared):
        raise _refuse(
            "key_query_shared_bottleneck",
            False,
            "a bottleneck needs it or use_bottleneck_attention (transformers' queries would read the full width)",
        )
    activation = src.pop("classifier_activation")
    data = bert_fields_from_hf(src)
    # google/mobilebert-uncased publishes false: its pooler returns the first token as it is (no pooler weights)
    data["pooler"] = {"name": "first_token" if activation else "first_token_plain"}
    # the kinds (trigram embedding, bottleneck layer, absolute positions) and the two norms transformers builds
    # without layer_norm_eps: FIXED, applied by the translator
    data["embedding"] = {"embedding_size": embedding_size, "trigram": trigram, "norm": norm}
    encoder = data["encoder"]
    encoder["layer"] = {
        "intra_bottleneck_size": intra if use_bottleneck else None,
        "key_query_shared_bottleneck": shared,
        "use_bottleneck_attention": bottleneck_attention,
        "num_feedforward_networks": ffns,
    }
    encoder["norm"] = {"name": norm}
    if use_bottleneck and not bottleneck_attention:
        encoder["attention"]["value_input_size"] = hidden
    architectures = hf.get("architectures") or []
    if len(architectures) == 1 and architectures[0] in _LANGUAGE_MODELS:
        data["head"] = {"name": _LANGUAGE_MODELS[architectures[0]], "embedding_size": embedding_size}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type", "is_decoder", "add_cross_attention"))
    # the options as given (the trigram embedding's and the bottleneck layer's defaults where absent); another
    # embedding or layer kind (BERT's) is MobileBERT without trigram, bottleneck or stacked blocks
    trigram = config.embedding.name == "trigram"
    emb = config.embedding.options() if trigram else {}
    bottleneck = config.encoder.layer.name == "bottleneck"
    layer = config.encoder.layer.options() if bottleneck else {"intra_bottleneck_size": None}
    intra = layer.get("intra_bottleneck_size", 128)
    out.update(
        embedding_size=emb.get("embedding_size", 128) if trigram else config.hidden_size,
        trigram_input=emb.get("trigram", False),
        use_bottleneck=intra is not None,
        intra_bottleneck_size=intra if intra is not None else DEFAULTS["intra_bottleneck_size"],
        use_bottleneck_attention=layer.get("use_bottleneck_attention", True),
        key_query_shared_bottleneck=layer.get("key_query_shared_bottleneck", False),
        num_feedforward_networks=layer.get("num_feedforward_networks", 1),
        normalization_type="no_norm" if config.encoder.norm.name == "no_norm" else "layer_norm",
        classifier_activation=config.pooler is None or config.pooler.name != "first_token_plain",
        true_hidden_size=intra if intra is not None else config.hidden_size,
    )
    return out


#: MobileBertConfig's fields: BERT's and the bottleneck's
FIELDS = {
    **BERT_FIELDS,
    "embedding_size": HFField(int, ge=1),
    "trigram_input": HFField(bool),
    "use_bottleneck": HFField(bool),
    "intra_bottleneck_size": HFField(int, ge=1),
    "use_bottleneck_attention": HFField(bool),
    "key_query_shared_bottleneck": HFField(bool),
    "num_feedforward_networks": HFField(int, ge=1),
    "normalization_type": HFField(str, choices=tuple(_NORMS)),
    "classifier_activation": HFField(bool, doc="false: the pooler returns the first token as it is"),
    "true_hidden_size": HFField(int, ge=1, doc="derived: intra_bottleneck_size with a bottleneck, else hidden_size"),
}

MOBILEBERT = Family(
    model_type=MODEL_TYPE,
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "MobileBertForMaskedLM": "bottleneck_masked_lm",
        "MobileBertForPreTraining": "bottleneck_pretraining",
        "MobileBertForNextSentencePrediction": "next_sentence",
        "MobileBertForSequenceClassification": "sequence_classification",
        "MobileBertForTokenClassification": "token_classification",
        "MobileBertForQuestionAnswering": "question_answering",
        "MobileBertForMultipleChoice": "multiple_choice",
    },
    base_architecture="MobileBertModel",
    fixed=FIXED,
    description="MobileBERT: bottleneck layers with stacked feed-forwards, NoNorm, trigram embeddings",
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=("MobileBertTokenizer", "MobileBertTokenizerFast")),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", MODEL_TYPE, lambda **_: MOBILEBERT, description=MOBILEBERT.description)]
