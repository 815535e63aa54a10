"""EuroBERT (``model_type: eurobert``): a Llama-style encoder. Token embeddings alone (no norm, no positions, no
token types), pre-norm layers with RMSNorm, bias-free query/key/value/output projections with RoPE (halves,
whole head), a SwiGLU feed-forward (``gate_proj``, ``up_proj``, ``down_proj``), a final RMSNorm; attention is
bidirectional. transformers' classes: ``EuroBertModel``, ``…ForMaskedLM`` (one linear ``lm_head``, whose bias is
``mlp_bias``), ``…ForSequenceClassification`` (``dense → gelu → classifier``, pooled by ``classifier_pooling``:
``bos`` the first token, ``mean`` the masked mean, ``late`` the masked mean of per-token logits) and
``…ForTokenClassification`` (one linear ``classifier``).

Composition: ``bert`` embedding with ``norm: false`` and no token types, ``rope`` (``ROPE_FIXED``), ``pre_ln``
layers with ``rmsnorm``, ``bert`` attention (separate projections), ``glu`` (split, the config's ``hidden_act``
on the gate); heads ``linear_masked_lm``, ``dense_pooled_classification``, ``token_classification``. Grouped-query
attention (``num_key_value_heads`` below ``num_attention_heads``, EuroBERT-610m and -2.1b) is the attention's
``num_kv_heads``. The key map only renames.

Dropout: transformers' EuroBERT drops only attention probabilities (``attention_dropout``); a config.json sets
bertblocks' other dropouts to 0, so training computes the same (other values travel in the ``bertblocks`` block).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.config.limits import check_layer_count
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError
from bertblocks.families.bertlike import BERT_FIELDS
from bertblocks.families.family import Family, RemoteCode, TokenizerConvention
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import KeyMap, Rename
from bertblocks.plugins.feedforward import GATED_ACTIVATIONS

from ._rotary_config import ROPE_FIELDS, ROPE_FIXED, rope_from_hf, rope_to_hf

#: EuroBertConfig's defaults, for the fields a config.json may leave out
DEFAULTS: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "pad_token_id": 128001,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "head_dim": None,
    "classifier_pooling": "late",
}
DEFAULT_THETA = 10000.0
#: EuroBERT's classifier_pooling → the pooling of ``dense_pooled_classification``
POOLING = {"bos": "first", "mean": "mean", "late": "late"}
LABEL_FIELDS = ("num_labels", "id2label", "label2id", "problem_type")

_L, _O = "model.layers.{i}", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="model",
    rules=(
        Rename("model.embed_tokens", "bert.embeddings.word_embeddings"),
        Rename(f"{_L}.input_layernorm", f"{_O}.attention_norm"),
        Rename(f"{_L}.self_attn.q_proj", f"{_O}.attention.self.query"),
        Rename(f"{_L}.self_attn.k_proj", f"{_O}.attention.self.key"),
        Rename(f"{_L}.self_attn.v_proj", f"{_O}.attention.self.value"),
        Rename(f"{_L}.self_attn.o_proj", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.post_attention_layernorm", f"{_O}.feedforward_norm"),
        Rename(f"{_L}.mlp.gate_proj", f"{_O}.intermediate.gate"),
        Rename(f"{_L}.mlp.up_proj", f"{_O}.intermediate.up"),
        Rename(f"{_L}.mlp.down_proj", f"{_O}.output.dense"),
        Rename("model.norm", "bert.encoder.final_norm"),
        Rename("lm_head", "decoder", heads=("linear_masked_lm",)),
    ),
    head_prefixes=("lm_head.", "dense.", "classifier."),
)

FIXED: dict[str, Any] = {
    **ROPE_FIXED,
    "embedding.name": "bert",
    "embedding.token_types": False,
    "embedding.norm": False,
    "encoder.layer.name": "pre_ln",
    "encoder.layer.first_attention_norm": True,
    "encoder.norm.name": "rmsnorm",
    "encoder.attention.name": "bert",
    "encoder.attention.fused_qkv": False,
    "encoder.feedforward.name": "glu",
    "encoder.feedforward.fused": False,
    "pooler": None,
    "is_decoder": False,
    "add_cross_attention": False,
}


class EuroBertConfigError(BertBlocksError, ValueError):
    """A EuroBERT ``config.json`` field (or a config to save as one) bertblocks cannot honour."""


def _refuse(field: str, value: Any, why: str) -> EuroBertConfigError:
    return EuroBertConfigError(f"eurobert config.json: {field}={value!r} is not supported: {why}")


def _head(architectures: Any, f: Mapping[str, Any]) -> dict[str, Any] | None:
    """The head spec a EuroBERT task class means, with its options from the config's fields."""
    name = EUROBERT_ARCHITECTURES.get(architectures[0]) if isinstance(architectures, list) else None
    if name is None or len(architectures) != 1:
        return None
    if name == "linear_masked_lm":
        return {"name": name, "decoder_bias": f["mlp_bias"]}  # EuroBertForMaskedLM's lm_head bias is mlp_bias
    if name == "dense_pooled_classification":
        return {"name": name, "pooling": POOLING[f["classifier_pooling"]], "activation": "gelu"}
    return {"name": name}


def kv_heads_from_hf(src: dict[str, Any], heads: Any, hidden: Any, model_type: str) -> int | None:
    """Pop ``num_key_value_heads`` and ``head_dim``: the attention's ``num_kv_heads`` (``None``: as many as heads).

    Raises:
        BertBlocksError: a head width other than ``hidden_size / num_attention_heads``, or key/value heads that
            do not divide the query heads.
    """
    kv = src.pop("num_key_value_heads", None)
    head_dim = src.pop("head_dim", None)
    error = EuroBertConfigError
    if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int)):
        raise error(f"{model_type} config.json: head_dim={head_dim!r} is not supported: it must be an integer")
    if head_dim is not None and isinstance(heads, int) and heads > 0 and head_dim * heads != hidden:
        raise error(
            f"{model_type} config.json: head_dim={head_dim!r} is not supported: heads are hidden_size / "
            f"num_attention_heads = {hidden}/{heads} wide in bertblocks' attention"
        )
    if kv is None or kv == heads:
        return None
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or not isinstance(heads, int) or heads % kv:
        raise error(
            f"{model_type} config.json: num_key_value_heads={kv!r} is not supported: it must be a positive "
            f"divisor of num_attention_heads ({heads})"
        )
    return kv


#: the published checkpoints still name their own remote classes, in their own folder (``auto_map`` to
#: ``modeling_eurobert.EuroBertModel`` …): the code transformers' native classes were ported from, so such a
#: config.json is translated like a native one. An ``auto_map`` naming any other class is refused as for every family.
REMOTE_CODE = RemoteCode(
    None,
    frozenset(
        {
            "configuration_eurobert.EuroBertConfig",
            *(
                f"modeling_eurobert.EuroBert{task}"
                for task in ("Model", "PreTrainedModel", "ForMaskedLM", "ForSequenceClassification")
            ),
            "modeling_eurobert.EuroBertForQuestionAnswering",
            "modeling_eurobert.EuroBertForTokenClassification",
        }
    ),
)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {k: v for k, v in hf.items() if k != "model_type"}
    architectures = src.pop("architectures", None)
    if isinstance(architectures, list) and len(architectures) == 1:
        name = architectures[0]
        if name.startswith("EuroBert") and name not in (*EUROBERT_ARCHITECTURES, "EuroBertModel"):
            raise _refuse(
                "architectures",
                architectures,
                f"{name} exists only as remote code; transformers' EuroBERT classes are EuroBertModel, "
                + ", ".join(EUROBERT_ARCHITECTURES),
            )
    if "clf_pooling" in src:  # the remote code's name of classifier_pooling (fine-tuned checkpoints carry it)
        old = src.pop("clf_pooling")
        if src.setdefault("classifier_pooling", old) != old:
            raise _refuse(
                "clf_pooling", old, f"it contradicts classifier_pooling={src['classifier_pooling']!r} (its new name)"
            )
    f = {key: src.pop(key, default) for key, default in DEFAULTS.items() if key not in ("num_key_value_heads",)}
    check_layer_count(f["num_hidden_layers"])
    kv = kv_heads_from_hf(
        {"num_key_value_heads": src.pop("num_key_value_heads", None), "head_dim": f.pop("head_dim")},
        f["num_attention_heads"],
        f["hidden_size"],
        "eurobert",
    )
    if src.get("rope_scaling") is not None:
        raise _refuse("rope_scaling", src["rope_scaling"], "bertblocks' rope scheme is the default, unscaled RoPE")
    src.pop("rope_scaling", None)
    position = rope_from_hf(src, DEFAULT_THETA)
    for flag in ("is_decoder", "add_cross_attention"):  # EuroBertConfig has neither: the model is an encoder
        if src.pop(flag, False):
            raise _refuse(flag, True, "EuroBERT's attention is bidirectional (an encoder)")
    if not isinstance(f["classifier_pooling"], str) or f["classifier_pooling"] not in POOLING:
        raise _refuse("classifier_pooling", f["classifier_pooling"], f"transformers has {', '.join(POOLING)}")
    head = _head(architectures, f)
    attention: dict[str, Any] = {
        "num_heads": f["num_attention_heads"],
        "dropout": f["attention_dropout"],
        "qkv_bias": f["attention_bias"],
        "output_bias": f["attention_bias"],
    }
    if kv is not None:
        attention["num_kv_heads"] = kv
    data: dict[str, Any] = {
        "vocab_size": f["vocab_size"],
        "hidden_size": f["hidden_size"],
        "max_position_embeddings": f["max_position_embeddings"],
        "type_vocab_size": 1,  # unused: no token-type table
        "pad_token_id": f["pad_token_id"],
        "layer_norm_eps": f["rms_norm_eps"],
        "hidden_dropout_prob": 0.0,
        "classifier_dropout": 0.0,
        "initializer_range": f["initializer_range"],
        "tie_word_embeddings": f["tie_word_embeddings"],
        "position": position,
        "encoder": {
            "num_layers": f["num_hidden_layers"],
            "attention": attention,
            "feedforward": {
                "intermediate_size": f["intermediate_size"],
                "activation": f["hidden_act"],
                "bias": f["mlp_bias"],
            },
        },
        "hf": src,  # the components, norms and no pooler: FIXED, applied by the translator
    }
    for key in LABEL_FIELDS:
        if key in src:
            data[key] = src.pop(key)
    if head is None or head["name"] != "dense_pooled_classification":
        src["classifier_pooling"] = f["classifier_pooling"]  # kept for the round trip
    if head is not None:
        data["head"] = head
    return data


def _check_saveable(config: BertConfig) -> None:
    """Refuse, naming the field, what a eurobert config.json would state otherwise (one ``attention_bias`` for
    every projection, the lm_head's bias is ``mlp_bias``, the classifier's gelu)."""
    attention = config.encoder.attention.options()
    if attention.get("qkv_bias", True) != attention.get("output_bias", True):
        raise EuroBertConfigError(
            "encoder.attention: qkv_bias and output_bias differ; a eurobert config.json has one attention_bias"
        )
    head = config.head
    if head is None:
        return
    options = head.options()
    mlp_bias = config.encoder.feedforward.options().get("bias", True)
    if head.name == "linear_masked_lm" and options.get("decoder_bias", True) != mlp_bias:
        raise EuroBertConfigError(
            "head.decoder_bias differs from encoder.feedforward.bias: EuroBertForMaskedLM's lm_head has a "
            "bias exactly when mlp_bias is true"
        )
    if head.name == "dense_pooled_classification" and options.get("activation", "gelu") != "gelu":
        raise EuroBertConfigError(
            f"head.activation={options['activation']!r}: EuroBertForSequenceClassification's is gelu"
        )


def _to_hf(config: BertConfig) -> dict[str, Any]:
    """``config`` as EuroBertConfig's fields. A eurobert config that its fields cannot state is refused; a config of
    another family is translated as far as the fields go (what they cannot say travels in the ``bertblocks``
    block, written by the caller)."""
    if config.family == "eurobert":
        _check_saveable(config)
    enc = config.encoder
    attention = enc.attention.options()
    feedforward = enc.feedforward.options()
    activation = enc.feedforward.activation
    out: dict[str, Any] = dict(config.hf)
    out.update(
        {
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": enc.feedforward.intermediate_size,
            "num_hidden_layers": enc.num_layers,
            "num_attention_heads": enc.attention.num_heads,
            "num_key_value_heads": attention.get("num_kv_heads") or enc.attention.num_heads,
            "head_dim": config.hidden_size // enc.attention.num_heads,
            "hidden_act": GATED_ACTIVATIONS.get(activation, activation),  # swiglu is the glu block with silu
            "max_position_embeddings": config.max_position_embeddings,
            "initializer_range": config.initializer_range,
            "rms_norm_eps": config.layer_norm_eps,
            "pad_token_id": config.pad_token_id,
            "tie_word_embeddings": config.tie_word_embeddings,
            "attention_bias": attention.get("qkv_bias", True),
            "attention_dropout": enc.attention.dropout,
            "mlp_bias": feedforward.get("bias", True),
            "id2label": {str(k): v for k, v in (config.id2label or {}).items()},
            "label2id": config.label2id,
            "problem_type": config.problem_type,
            **rope_to_hf(config),
        }
    )
    head = config.head
    if head is not None and head.name == "dense_pooled_classification":
        options = head.options()
        by_pooling = {v: k for k, v in POOLING.items()}
        out["classifier_pooling"] = by_pooling[options.get("pooling", "late")]
    return out


EUROBERT_ARCHITECTURES: dict[str, str] = {
    "EuroBertForMaskedLM": "linear_masked_lm",
    "EuroBertForSequenceClassification": "dense_pooled_classification",
    "EuroBertForTokenClassification": "token_classification",
}

#: Llama-3's special tokens with EuroBERT's mask; a text is framed <|begin_of_text|> A <|end_of_text|> when the
#: tokenizer.json has no post-processor of its own; no token types (the model has none)
EUROBERT_TOKENIZER = TokenizerConvention(
    special_tokens={
        "unk_token": "<|end_of_text|>",  # Llama-3's byte-level BPE has no unknown token; any byte sequence encodes
        "sep_token": "<|end_of_text|>",
        "pad_token": "<|end_of_text|>",
        "cls_token": "<|begin_of_text|>",
        "mask_token": "<|mask|>",
    },
    single="<|begin_of_text|> $A <|end_of_text|>",
    pair="<|begin_of_text|> $A <|end_of_text|> $B <|end_of_text|>",
    model_input_names=("input_ids", "attention_mask"),
)

#: EuroBertConfig's fields (and the remote code's clf_pooling)
FIELDS = {
    **{name: BERT_FIELDS[name] for name in (*LABEL_FIELDS, "vocab_size", "hidden_size", "num_hidden_layers")},
    **{name: BERT_FIELDS[name] for name in ("num_attention_heads", "intermediate_size", "max_position_embeddings")},
    **{name: BERT_FIELDS[name] for name in ("pad_token_id", "initializer_range", "is_decoder", "add_cross_attention")},
    **ROPE_FIELDS,
    "num_key_value_heads": HFField(int, ge=1, nullable=True),
    "head_dim": HFField(int, ge=1, nullable=True),
    "hidden_act": HFField(str),
    "rms_norm_eps": HFField(float, gt=0),
    "tie_word_embeddings": HFField(bool),
    "attention_bias": HFField(bool),
    "attention_dropout": HFField(float, ge=0, le=1),
    "mlp_bias": HFField(bool),
    "classifier_pooling": HFField(str),
    "clf_pooling": HFField(str),
    "rope_scaling": HFField(dict, nullable=True),
}

EUROBERT = Family(
    model_type="eurobert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures=EUROBERT_ARCHITECTURES,
    base_architecture="EuroBertModel",
    fixed=FIXED,
    description="EuroBERT: Llama-style encoder, pre-RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases",
    tokenizer=EUROBERT_TOKENIZER,
    remote_code=(REMOTE_CODE,),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "eurobert", lambda **_: EUROBERT, description=EUROBERT.description)]
