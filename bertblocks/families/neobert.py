"""NeoBERT (``model_type: neobert``; its published checkpoints ship remote code, which bertblocks never runs: the
family translates their ``config.json`` field by field). A Llama-style encoder: token embeddings alone
(``model.encoder``; no norm, no positions, no token types), pre-norm layers with RMSNorm (``attention_norm``,
``ffn_norm``), one bias-free fused ``qkv`` projection grouped per head (each head's query, key and value rows in
turn) with RoPE on consecutive pairs (θ = 10000), a bias-free output ``wo``, a SwiGLU feed-forward (``ffn.w12``:
the SiLU-gated half first, then the linear half; ``ffn.w3``) of width ``int(2·intermediate_size/3)`` rounded up to
a multiple of 8, a final RMSNorm (``model.layer_norm``). No dropout in the encoder.

Heads: ``NeoBERTLMHead`` is one linear ``decoder`` with a bias, not tied to the embeddings
(``linear_masked_lm``; later exports' ``lm_head_bias: false`` and ``tie_word_embeddings: true`` are read too);
``NeoBERTForSequenceClassification`` reads the first token through dropout → ``dense`` → tanh → dropout →
``classifier`` (``dense_pooled_classification``, ``classifier_dropout``, 0.1 by default).

Composition: ``bert`` embedding (``norm: false``, no token types), ``rope`` (``interleaved``), ``pre_ln`` layers
with ``rmsnorm``, ``bert`` attention (``fused_qkv``, ``qkv_layout: heads``, no biases), fused ``glu`` (swiglu,
no bias). The key map only renames. There is no transformers class: the tests compare with a float64 reference
of these equations (docs/explanation/model-families.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.config.limits import check_layer_count
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError
from bertblocks.families.bertlike import BERT_FIELDS
from bertblocks.families.family import BERT_TOKENIZER, Family, RemoteCode
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import KeyMap, Rename

#: NeoBERTConfig's defaults (its published description), for the fields a config.json may leave out
DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
    "pad_token_id": 0,
    "max_length": 1024,
    "norm_eps": 1e-6,
    "classifier_dropout": 0.1,
}
#: NeoBERT's rotary base (its code fixes it; no config field sets it)
THETA = 10000.0
#: the SwiGLU width is rounded up to a multiple of this
MULTIPLE_OF = 8
#: switches of later NeoBERT exports: the value bertblocks builds (any other is refused, naming the field)
SWITCHES: dict[str, Any] = {"hidden_act": "swiglu", "rms_norm": True, "rope": True, "ngpt": False}
LABEL_FIELDS = ("num_labels", "id2label", "label2id", "problem_type")

_L, _O = "model.transformer_encoder.{i}", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="model",
    rules=(
        Rename("model.encoder", "bert.embeddings.word_embeddings"),
        Rename(f"{_L}.attention_norm", f"{_O}.attention_norm"),
        Rename(f"{_L}.qkv", f"{_O}.attention.self.Wqkv"),
        Rename(f"{_L}.wo", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.ffn_norm", f"{_O}.feedforward_norm"),
        Rename(f"{_L}.ffn.w12", f"{_O}.intermediate.dense"),
        Rename(f"{_L}.ffn.w3", f"{_O}.output.dense"),
        Rename("model.layer_norm", "bert.encoder.final_norm"),
    ),
    head_prefixes=("decoder.", "dense.", "classifier."),
)

FIXED: dict[str, Any] = {
    "position.name": "rope",
    "position.interleaved": True,
    "position.rotary_dim": None,
    "position.rotary_fraction": None,
    "embedding.name": "bert",
    "embedding.token_types": False,
    "embedding.norm": False,
    "embedding.position_offset": "none",
    "encoder.layer.name": "pre_ln",
    "encoder.layer.first_attention_norm": True,
    "encoder.norm.name": "rmsnorm",
    "encoder.attention.name": "bert",
    "encoder.attention.fused_qkv": True,
    "encoder.attention.qkv_layout": "heads",
    "encoder.attention.qkv_bias": False,
    "encoder.attention.output_bias": False,
    "encoder.attention.num_kv_heads": None,
    "encoder.feedforward.name": "glu",
    "encoder.feedforward.fused": True,
    "encoder.feedforward.bias": False,
    "pooler": None,
    "is_decoder": False,
    "add_cross_attention": False,
    "hidden_dropout_prob": 0.0,
}


class NeoBertConfigError(BertBlocksError, ValueError):
    """A NeoBERT ``config.json`` field (or a config to save as one) bertblocks cannot honour."""


def _refuse(field: str, value: Any, why: str) -> NeoBertConfigError:
    return NeoBertConfigError(f"neobert config.json: {field}={value!r} is not supported: {why}")


def swiglu_width(intermediate_size: int) -> int:
    """NeoBERT's SwiGLU width: ``int(2·intermediate_size/3)`` rounded up to a multiple of 8 (3072 → 2048)."""
    width = int(2 * intermediate_size / 3)
    return MULTIPLE_OF * ((width + MULTIPLE_OF - 1) // MULTIPLE_OF)


#: NeoBERT publishes its code beside its weights (``auto_map`` to ``model.NeoBERT`` …), the code this family
#: reproduces; every NeoBERT config.json names it
REMOTE_CODE = RemoteCode(
    None,
    frozenset(
        {"model.NeoBERTConfig", "model.NeoBERT", "model.NeoBERTLMHead", "model.NeoBERTForSequenceClassification"}
    ),
)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {k: v for k, v in hf.items() if k != "model_type"}
    architectures = src.pop("architectures", None)
    f = {key: src.pop(key, default) for key, default in DEFAULTS.items()}
    check_layer_count(f["num_hidden_layers"])
    hidden, heads, size = f["hidden_size"], f["num_attention_heads"], f["intermediate_size"]
    for field, built in SWITCHES.items():
        value = src.pop(field, built)
        if value != built:
            raise _refuse(field, value, f"bertblocks builds NeoBERT with {field}={built!r}")
    dim_head = src.pop("dim_head", None)
    if dim_head is not None and (isinstance(dim_head, bool) or not isinstance(dim_head, int)):
        raise _refuse("dim_head", dim_head, "it must be an integer")
    if dim_head is not None and isinstance(heads, int) and heads > 0 and dim_head * heads != hidden:
        raise _refuse("dim_head", dim_head, f"heads are hidden_size / num_attention_heads = {hidden}/{heads} wide")
    positions = src.pop("max_position_embeddings", None)
    if positions is not None and positions != f["max_length"]:
        raise _refuse("max_position_embeddings", positions, f"it differs from max_length ({f['max_length']})")
    theta = src.pop("rope_theta", THETA)
    if theta != THETA:
        raise _refuse("rope_theta", theta, f"NeoBERT's rotary base is fixed at {THETA:g}")
    # later exports may say these; the published checkpoints do not (an untied decoder with a bias)
    tie = src.pop("tie_word_embeddings", False)
    lm_head_bias = src.pop("lm_head_bias", True)
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise _refuse("intermediate_size", size, "must be an integer of at least 2")
    data: dict[str, Any] = {
        "vocab_size": f["vocab_size"],
        "hidden_size": hidden,
        "max_position_embeddings": f["max_length"],
        "type_vocab_size": 1,  # unused: no token-type table
        "pad_token_id": f["pad_token_id"],
        "layer_norm_eps": f["norm_eps"],
        "classifier_dropout": f["classifier_dropout"],
        "tie_word_embeddings": tie,
        # the components' fixed shape (interleaved rope, fused biasless QKV and SwiGLU, pre-LN with RMSNorm, no
        # pooler, no dropout): FIXED, applied by the translator
        "position": {"base": THETA},
        "encoder": {
            "num_layers": f["num_hidden_layers"],
            "attention": {"num_heads": heads, "dropout": 0.0},
            "feedforward": {"intermediate_size": swiglu_width(size), "activation": "silu"},
        },
        # the field as written (several intermediate_size give one width): saved back unchanged
        "hf": {**src, "intermediate_size": size},
    }
    for key in LABEL_FIELDS:
        if key in src:
            data[key] = data["hf"].pop(key)
    name = NEOBERT_ARCHITECTURES.get(architectures[0]) if isinstance(architectures, list) else None
    if name is not None and len(architectures) == 1:
        data["head"] = dict(name)
        if data["head"]["name"] == "linear_masked_lm":
            data["head"]["decoder_bias"] = lm_head_bias
    if not lm_head_bias and data.get("head", {}).get("name") != "linear_masked_lm":
        data["hf"]["lm_head_bias"] = False  # kept for the round trip
    return data


def _check_saveable(config: BertConfig) -> None:
    """Refuse, naming the field, what a neobert config.json cannot state (its code fixes it)."""
    enc = config.encoder
    width = enc.feedforward.intermediate_size
    if width % MULTIPLE_OF:
        raise NeoBertConfigError(
            f"encoder.feedforward.intermediate_size={width}: a neobert config.json states SwiGLU widths that are "
            f"multiples of {MULTIPLE_OF} only (int(2·intermediate_size/3) rounded up)"
        )
    if enc.feedforward.activation not in ("silu", "swiglu"):
        raise NeoBertConfigError(
            f"encoder.feedforward.activation={enc.feedforward.activation!r}: NeoBERT's feed-forward is SwiGLU"
        )
    base = config.position.options().get("base", THETA)
    if base != THETA:
        raise NeoBertConfigError(f"position.base={base!r}: NeoBERT's rotary base is fixed at {THETA:g}")
    if enc.attention.dropout:
        raise NeoBertConfigError("encoder.attention.dropout: NeoBERT's encoder drops nothing; set it to 0")
    head = config.head
    if head is not None and head.name == "dense_pooled_classification":
        options = head.options()
        if (options.get("pooling", "late"), options.get("activation", "gelu")) != ("first", "tanh"):
            raise NeoBertConfigError(
                "head.pooling / head.activation: NeoBERTForSequenceClassification reads the first token through "
                "tanh (pooling: first, activation: tanh)"
            )


def _to_hf(config: BertConfig) -> dict[str, Any]:
    """``config`` as NeoBERT's config.json fields. A neobert config they cannot state is refused; a config of
    another family is translated as far as the fields go (the rest travels in the ``bertblocks`` block)."""
    if config.family == "neobert":
        _check_saveable(config)
    enc = config.encoder
    width = enc.feedforward.intermediate_size
    out: dict[str, Any] = dict(config.hf)
    written = out.get("intermediate_size")
    size = written if isinstance(written, int) and swiglu_width(written) == width else 3 * width // 2
    out.update(
        {
            "hidden_size": config.hidden_size,
            "num_hidden_layers": enc.num_layers,
            "num_attention_heads": enc.attention.num_heads,
            "intermediate_size": size,
            "vocab_size": config.vocab_size,
            "max_length": config.max_position_embeddings,
            "norm_eps": config.layer_norm_eps,
            "pad_token_id": config.pad_token_id,
            "dim_head": config.hidden_size // enc.attention.num_heads,
            "classifier_dropout": config.classifier_dropout if config.classifier_dropout is not None else 0.0,
            "tie_word_embeddings": config.tie_word_embeddings,
            "id2label": {str(k): v for k, v in (config.id2label or {}).items()},
            "label2id": config.label2id,
            "problem_type": config.problem_type,
        }
    )
    if config.head is not None and config.head.name == "linear_masked_lm":
        if config.head.options().get("decoder_bias", True):
            out.pop("lm_head_bias", None)  # the published format's decoder has a bias: no field says so
        else:
            out["lm_head_bias"] = False
    return out


NEOBERT_ARCHITECTURES: dict[str, Mapping[str, Any]] = {
    "NeoBERTLMHead": {"name": "linear_masked_lm", "decoder_bias": True},
    "NeoBERTForSequenceClassification": {
        "name": "dense_pooled_classification",
        "pooling": "first",
        "activation": "tanh",
    },
}

#: NeoBERTConfig's fields (its names: max_length, norm_eps, dim_head) and the switches of later exports
FIELDS = {
    **{name: BERT_FIELDS[name] for name in (*LABEL_FIELDS, "vocab_size", "hidden_size", "num_hidden_layers")},
    **{name: BERT_FIELDS[name] for name in ("num_attention_heads", "intermediate_size", "pad_token_id")},
    "max_length": HFField(int, ge=1),
    "norm_eps": HFField(float, gt=0),
    "classifier_dropout": HFField(float, ge=0, le=1, nullable=True),
    "hidden_act": HFField(str),
    "rms_norm": HFField(bool),
    "rope": HFField(bool),
    "ngpt": HFField(bool),
    "dim_head": HFField(int, ge=1, nullable=True),
    "max_position_embeddings": HFField(int, ge=1, nullable=True),
    "rope_theta": HFField(float, gt=0),
    "tie_word_embeddings": HFField(bool),
    "lm_head_bias": HFField(bool),
}

NEOBERT = Family(
    model_type="neobert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures=NEOBERT_ARCHITECTURES,
    base_architecture="NeoBERT",
    fixed=FIXED,
    description="NeoBERT: Llama-style encoder, pre-RMSNorm, per-head fused QKV, interleaved RoPE, SwiGLU, no biases",
    # bert-base-uncased's WordPiece vocabulary framed BERT's way, [CLS] A [SEP] (B [SEP]); the model takes no token
    # types and its tokenizer returns none
    tokenizer=replace(BERT_TOKENIZER, model_input_names=("input_ids", "attention_mask")),
    remote_code=(REMOTE_CODE,),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "neobert", lambda **_: NEOBERT, description=NEOBERT.description)]
