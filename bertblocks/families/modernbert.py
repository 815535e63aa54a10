"""ModernBERT: token embeddings → LayerNorm (no positions, no token types), pre-LN layers whose layer 0 attends to
the embeddings unnormalised, fused bias-free ``Wqkv`` with RoPE, a fused gated feed-forward (``Wi``), a final norm,
and global layers (every ``global_attn_every_n_layers``-th, RoPE base ``global_rope_theta``) between local ones
(sliding window ``local_attention``, base ``local_rope_theta``). Its heads put a dense → act → norm transform
before every output layer (:mod:`.transform_heads`).

Composition: ``pre_ln`` layers (``first_attention_norm: false``), ``layernorm`` norms with ``norm_bias``, ``rope``
at the global base, fused ``glu``; the local layers are one per-layer override (``sliding_window`` backend and the
local RoPE base). The key map only renames.

Dropout in training: bertblocks drops at BERT's places with ``hidden_dropout_prob`` (= ``embedding_dropout``) and
the attention probabilities with ``attention_dropout``; ``mlp_dropout`` is kept for the round trip. Every
published ModernBERT sets all of them to 0, where both compute the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.config.limits import check_layer_count
from bertblocks.core.component import Component
from bertblocks.families.bertlike import BERT_FIELDS
from bertblocks.families.family import BERT_TOKENIZER, Family
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import KeyMap, Rename
from bertblocks.plugins.heads.transform_heads import TRANSFORM_HEADS

from ..errors import InputError

FULL, SLIDING = "full_attention", "sliding_attention"
#: ModernBertConfig's defaults, for the fields a config.json may leave out
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "hidden_activation": "gelu",
    "max_position_embeddings": 8192,
    "initializer_range": 0.02,
    "norm_eps": 1e-5,
    "norm_bias": False,
    "pad_token_id": 50283,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "local_attention": 128,
    "embedding_dropout": 0.0,
    "mlp_bias": False,
    "decoder_bias": True,
    "classifier_pooling": "cls",
    "classifier_dropout": 0.0,
    "classifier_bias": False,
    "classifier_activation": "gelu",
    "sparse_prediction": False,
    "sparse_pred_ignore_index": -100,
    "tie_word_embeddings": True,
}
THETA = {FULL: 160_000.0, SLIDING: 10_000.0}
#: fields read into the head's options when the config.json names a task class (kept under ``hf`` otherwise)
HEAD_FIELDS = (
    "classifier_pooling",
    "classifier_bias",
    "classifier_activation",
    "decoder_bias",
    "sparse_prediction",
    "sparse_pred_ignore_index",
)
LABEL_FIELDS = ("num_labels", "id2label", "label2id", "problem_type")

_L, _O = "model.layers.{i}", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="model",
    rules=(
        Rename("model.embeddings.tok_embeddings", "bert.embeddings.word_embeddings"),
        Rename("model.embeddings.norm", "bert.embeddings.LayerNorm"),
        Rename(f"{_L}.attn_norm", f"{_O}.attention_norm"),  # none in layer 0
        Rename(f"{_L}.attn.Wqkv", f"{_O}.attention.self.Wqkv"),
        Rename(f"{_L}.attn.Wo", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.mlp_norm", f"{_O}.feedforward_norm"),
        Rename(f"{_L}.mlp.Wi", f"{_O}.intermediate.dense"),
        Rename(f"{_L}.mlp.Wo", f"{_O}.output.dense"),
        Rename("model.final_norm", "bert.encoder.final_norm"),
        Rename("head", "transform", heads=TRANSFORM_HEADS),
        Rename("classifier", "qa_outputs", heads=("transform_question_answering",)),
    ),
    head_prefixes=("head.", "decoder.", "classifier."),
)


# ------------------------------------------------------------------------------------------------ config.json
def _layer_types(src: dict[str, Any], num_layers: int) -> list[str]:
    every = src.pop("global_attn_every_n_layers", 3)  # the older form; layer_types wins when both are given
    types = src.pop("layer_types", None)
    if types is None:
        if not isinstance(every, int) or every < 1:
            raise InputError(f"global_attn_every_n_layers must be a positive integer; got {every!r}")
        return [SLIDING if i % every else FULL for i in range(num_layers)]
    if not isinstance(types, list) or len(types) != num_layers or any(t not in (FULL, SLIDING) for t in types):
        raise InputError(
            f"layer_types must list {FULL!r} or {SLIDING!r} for each of the {num_layers} layers; got {types!r}"
        )
    return list(types)


def _rope_bases(src: dict[str, Any]) -> dict[str, float]:
    if src.pop("rope_scaling", None) is not None:
        raise InputError("rope_scaling is not supported (bertblocks' rope is the default, unscaled RoPE)")
    params = src.pop("rope_parameters", None) or {}
    if not isinstance(params, Mapping) or any(not isinstance(v, Mapping | None) for v in params.values()):
        raise InputError(f"rope_parameters must map layer types to their rope fields; got {params!r}")
    old = {FULL: src.pop("global_rope_theta", None), SLIDING: src.pop("local_rope_theta", None)}
    bases = {}
    for kind in (FULL, SLIDING):
        given = dict(params.get(kind) or {})
        rope_type = given.pop("rope_type", "default")
        if rope_type != "default":
            raise InputError(f"rope_parameters.{kind}.rope_type {rope_type!r} is not supported (only 'default')")
        theta = given.pop("rope_theta", None)
        if given:
            raise InputError(f"rope_parameters.{kind}: unsupported fields {sorted(given)}")
        bases[kind] = float(theta if theta is not None else old[kind] if old[kind] is not None else THETA[kind])
    return bases


def _head(architectures: Any, fields: Mapping[str, Any]) -> dict[str, Any] | None:
    """The head spec a ModernBERT task class means, with its options from the config's head fields."""
    name = MODERNBERT_ARCHITECTURES.get(architectures[0]) if isinstance(architectures, list) else None
    if name is None or len(architectures) != 1:
        return None
    transform = {
        "activation": fields["classifier_activation"],
        "dense_bias": fields["classifier_bias"],
        "norm_bias": fields["norm_bias"],
    }
    if name == "transform_masked_lm":
        return {
            "name": name,
            **transform,
            "decoder_bias": fields["decoder_bias"],
            "sparse_prediction": fields["sparse_prediction"],
            "sparse_ignore_index": fields["sparse_pred_ignore_index"],
        }
    if name in ("transform_classification", "transform_multiple_choice"):
        if fields["classifier_pooling"] not in ("cls", "mean"):
            raise InputError(f"classifier_pooling must be 'cls' or 'mean'; got {fields['classifier_pooling']!r}")
        # transformers' multiple-choice class takes the first *real* token as cls (attention_mask.argmax)
        cls = "first_real" if name == "transform_multiple_choice" else "first"
        return {"name": name, **transform, "pooling": cls if fields["classifier_pooling"] == "cls" else "mean"}
    return {"name": name, **transform}


def _read_by(head: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The config.json head fields that ``head``'s options hold."""
    if head is None:
        return ()
    read: tuple[str, ...] = ("classifier_activation", "classifier_bias")
    if head["name"] == "transform_masked_lm":
        read += ("decoder_bias", "sparse_prediction", "sparse_pred_ignore_index")
    if "pooling" in head:
        read += ("classifier_pooling",)
    return read


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {k: v for k, v in hf.items() if k != "model_type"}
    architectures = src.pop("architectures", None)
    f = {key: src.pop(key, default) for key, default in DEFAULTS.items()}
    check_layer_count(f["num_hidden_layers"])  # before one layer type is spelt out per layer
    types = _layer_types(src, f["num_hidden_layers"])
    bases = _rope_bases(src)
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    head = _head(architectures, f)
    # the head fields its head does not read (all of them without a head) are kept for the round trip
    extras = {k: f[k] for k in HEAD_FIELDS if k not in _read_by(head)}
    data: dict[str, Any] = {
        "vocab_size": f["vocab_size"],
        "hidden_size": f["hidden_size"],
        "max_position_embeddings": f["max_position_embeddings"],
        "type_vocab_size": 1,  # unused: no token-type table
        "pad_token_id": f["pad_token_id"],
        "layer_norm_eps": f["norm_eps"],
        "hidden_dropout_prob": f["embedding_dropout"],
        "initializer_range": f["initializer_range"],
        "tie_word_embeddings": f["tie_word_embeddings"],
        "classifier_dropout": f["classifier_dropout"],
        # the fixed facts (rope, no token types, fused QKV and GLU, pre-LN, no pooler): `fixed`, which the
        # translator applies
        "embedding": {"name": "bert", "norm_bias": f["norm_bias"]},
        "position": {"base": bases[FULL]},
        "encoder": {
            "num_layers": f["num_hidden_layers"],
            "attention": {
                "num_heads": f["num_attention_heads"],
                "dropout": f["attention_dropout"],
                "qkv_bias": f["attention_bias"],
                "output_bias": f["attention_bias"],
            },
            "feedforward": {
                "intermediate_size": f["intermediate_size"],
                "activation": f["hidden_activation"],
                "bias": f["mlp_bias"],
            },
            "norm": {"name": "layernorm", "bias": f["norm_bias"]},
            "overrides": [
                {
                    "layers": sliding,
                    "attention": {"backend": {"name": "sliding_window", "window": f["local_attention"]}},
                    "position": {"base": bases[SLIDING]},
                }
            ]
            if sliding
            else [],
        },
        "hf": {**src, **extras},
    }
    for key in LABEL_FIELDS:
        if key in src:
            data[key] = data["hf"].pop(key)
    if not sliding:
        data["hf"]["local_attention"] = f["local_attention"]  # no local layer holds it
    if head is not None:
        data["head"] = head
    return data


def _every_n(types: list[str]) -> int | None:
    """The ``global_attn_every_n_layers`` that gives ``types`` (3, the default, when it does), or ``None``."""
    for every in (3, *range(1, len(types) + 1)):
        if types == [SLIDING if i % every else FULL for i in range(len(types))]:
            return every
    return None


def _to_hf(config: BertConfig) -> dict[str, Any]:
    enc = config.encoder
    out: dict[str, Any] = dict(config.hf)
    types, windows, bases = [], [], {FULL: [], SLIDING: []}
    for i in range(enc.num_layers):
        backend = enc.layer_spec(i, "attention").backend
        kind = SLIDING if backend.name == "sliding_window" else FULL
        types.append(kind)
        if kind == SLIDING:
            windows.append(backend.options().get("window", DEFAULTS["local_attention"]))
        bases[kind].append(enc.layer_position(i, config.position).options().get("base", THETA[kind]))
    # what config.json cannot say (layers of one kind that differ) travels under `bertblocks`, written by the caller
    rope = {
        kind: {"rope_type": "default", "rope_theta": (values or [THETA[kind]])[0]} for kind, values in bases.items()
    }
    attention = enc.attention.options()
    feedforward = enc.feedforward.options()
    norm_bias = enc.norm.options().get("bias", True)
    out.update(
        {
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": enc.feedforward.intermediate_size,
            "num_hidden_layers": enc.num_layers,
            "num_attention_heads": enc.attention.num_heads,
            "hidden_activation": enc.feedforward.activation,
            "max_position_embeddings": config.max_position_embeddings,
            "initializer_range": config.initializer_range,
            "norm_eps": config.layer_norm_eps,
            "norm_bias": norm_bias,
            "pad_token_id": config.pad_token_id,
            "attention_bias": attention.get("qkv_bias", True),
            "attention_dropout": enc.attention.dropout,
            "layer_types": types,
            "rope_parameters": rope,
            "embedding_dropout": config.hidden_dropout_prob,
            "mlp_bias": feedforward.get("bias", True),
            "classifier_dropout": config.classifier_dropout
            if config.classifier_dropout is not None
            else config.hidden_dropout_prob,
            "tie_word_embeddings": config.tie_word_embeddings,
            "num_labels": config.num_labels,
            "id2label": {str(k): v for k, v in (config.id2label or {}).items()},
            "label2id": config.label2id,
            "problem_type": config.problem_type,
        }
    )
    if windows:
        out["local_attention"] = windows[0]
    # transformers 4.x reads the older fields only (5.x prefers layer_types and rope_parameters, which agree)
    out["global_rope_theta"] = rope[FULL]["rope_theta"]
    out["local_rope_theta"] = rope[SLIDING]["rope_theta"]
    every = _every_n(types)
    if every is not None:
        out["global_attn_every_n_layers"] = every
    else:  # a pattern 4.x cannot say: no value rather than a wrong one (4.x readers build its default, every 3rd)
        out.pop("global_attn_every_n_layers", None)
    out.setdefault("mlp_dropout", config.hidden_dropout_prob)
    head = config.head
    if head is not None and head.name in TRANSFORM_HEADS:
        options = head.options()
        out["classifier_activation"] = options.get("activation", DEFAULTS["classifier_activation"])
        out["classifier_bias"] = options.get("dense_bias", DEFAULTS["classifier_bias"])
        if head.name == "transform_masked_lm":
            out["decoder_bias"] = options.get("decoder_bias", DEFAULTS["decoder_bias"])
            out["sparse_prediction"] = options.get("sparse_prediction", DEFAULTS["sparse_prediction"])
            out["sparse_pred_ignore_index"] = options.get("sparse_ignore_index", DEFAULTS["sparse_pred_ignore_index"])
        if "pooling" in options:
            out["classifier_pooling"] = "mean" if options["pooling"] == "mean" else "cls"
    return out


MODERNBERT_ARCHITECTURES: dict[str, str] = {
    "ModernBertForMaskedLM": "transform_masked_lm",
    "ModernBertForSequenceClassification": "transform_classification",
    "ModernBertForTokenClassification": "transform_token_classification",
    "ModernBertForQuestionAnswering": "transform_question_answering",
    "ModernBertForMultipleChoice": "transform_multiple_choice",
}

_SIZE, _RATE, _POSITIVE = HFField(int, ge=1), HFField(float, ge=0, le=1), HFField(float, gt=0)
#: ModernBertConfig's fields (its names: norm_eps, hidden_activation, …) and the older rope/layer-pattern ones
FIELDS = {
    **{name: BERT_FIELDS[name] for name in (*LABEL_FIELDS, "vocab_size", "hidden_size", "intermediate_size")},
    **{name: BERT_FIELDS[name] for name in ("num_hidden_layers", "num_attention_heads", "max_position_embeddings")},
    "hidden_activation": HFField(str),
    "initializer_range": _POSITIVE,
    "norm_eps": _POSITIVE,
    "norm_bias": HFField(bool),
    "pad_token_id": HFField(int, ge=0, nullable=True),
    "attention_bias": HFField(bool),
    "attention_dropout": _RATE,
    "local_attention": _SIZE,
    "embedding_dropout": _RATE,
    "mlp_bias": HFField(bool),
    "decoder_bias": HFField(bool),
    "classifier_pooling": HFField(str, choices=("cls", "mean")),
    "classifier_dropout": _RATE,
    "classifier_bias": HFField(bool),
    "classifier_activation": HFField(str),
    "sparse_prediction": HFField(bool),
    "sparse_pred_ignore_index": HFField(int),
    "tie_word_embeddings": HFField(bool),
    "global_attn_every_n_layers": _SIZE,
    "layer_types": HFField(list, items=str, choices=(FULL, SLIDING), nullable=True),
    "rope_scaling": HFField(dict, nullable=True),
    "rope_parameters": HFField(dict, nullable=True),
    "global_rope_theta": HFField(float, gt=0, nullable=True),
    "local_rope_theta": HFField(float, gt=0, nullable=True),
}

MODERNBERT = Family(
    model_type="modernbert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures=MODERNBERT_ARCHITECTURES,
    base_architecture="ModernBertModel",
    fixed={
        "position.name": "rope",
        "embedding.token_types": False,
        "pooler": None,
        "encoder.layer.name": "pre_ln",
        "encoder.layer.first_attention_norm": False,
        "encoder.feedforward.name": "glu",
        "encoder.feedforward.fused": True,
        "encoder.attention.fused_qkv": True,
    },
    description="ModernBERT: pre-LN, RoPE with global/local bases, sliding-window layers, fused GLU, no biases",
    # a BPE tokenizer.json (OLMo's vocabulary) framed BERT's way, [CLS] A [SEP] (B [SEP]); the model takes no token
    # types, and its tokenizer_config.json names the generic PreTrainedTokenizerFast
    tokenizer=replace(BERT_TOKENIZER, model_input_names=("input_ids", "attention_mask")),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "modernbert", lambda **_: MODERNBERT, description=MODERNBERT.description)]
