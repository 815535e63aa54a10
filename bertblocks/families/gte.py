"""GTE (Alibaba's "transformer++" encoders: gte-base-en-v1.5, gte-large-en-v1.5, gte-multilingual-base) in its two
config formats, one checkpoint layout:

* ``model_type: gte`` — transformers' native ``GteConfig`` / ``GteModel`` (``rope_parameters``);
* ``model_type: new`` — Alibaba's published remote-code format (``auto_map`` to ``NewModel`` …, ``rope_theta`` with
  ``rope_scaling: {type: ntk, factor}`` and switches such as ``pack_qkv``). bertblocks reads its config.json field
  by field; nothing ``auto_map`` names is imported or run.

What differs from BERT, as components: position ``rope`` (halves, whole head; ``θ = rope_theta``, GteConfig's
default 160000), no position table and no position offset (positions 0, 1, 2, … padding included, as the
classes count them); the ``new`` format's ``rope_scaling: {type: ntk, factor: k}`` is the scheme's fixed NTK-aware
scaling (``ntk_factor: k``: ``θ_i = (θ·k)^(-2i/d) / k^(2/d)``); attention ``fused_qkv`` with biases; feed-forward
``glu`` (``down(act(gate(x)) · up(x))``, the activation ``hidden_act``), its gate and up projections without bias
and its output projection with one (``input_bias: false``), the gated product dropped out in training
(``dropout_at: both``); BERT's post-LN layers; ``type_vocab_size: 0``
(gte-base-en-v1.5) means no token-type table. The backbone has no pooler (``GteModel(add_pooling_layer=False)``);
the sequence classifier has BERT's. The masked LM's head is RoBERTa's gelu transform, its bias stored on the
decoder.

The checkpoint (what transformers' GTE classes write; the published ``new`` checkpoints use the same names under
the prefix ``new.``): ``gte.embeddings.{word_embeddings,token_type_embeddings,LayerNorm}``,
``gte.encoder.layer.{i}.attention.qkv_proj`` (query, key, value rows), ``attention.o_proj``, ``attn_ln``,
``mlp.up_gate_proj`` (up rows, then gate rows), ``mlp.down_proj``, ``mlp_ln``; ``gte.pooler.dense``,
``classifier``; ``lm_head.dense``, ``lm_head.norm``, ``lm_head.decoder``. A ``gte`` checkpoint under transformers'
in-memory names (``save_original_format=False``: ``gte.layers.{i}.self_attn.q_proj``, ``mlp.gate_proj``,
``lm_head.layer_norm``, …) loads too; bertblocks writes the names above.

What the ``new`` format is refused for, naming the field: ``position_embedding_type`` other than ``rope``,
``layer_norm_type`` other than ``layer_norm``, ``pack_qkv: false`` (separate projections under names no published
checkpoint shows), ``logn_attention_scale`` / ``logn_attention_clip1`` true, a ``rope_scaling`` type other than
``ntk`` or with ``mixed_b`` (mixed NTK), and a config without ``rope_theta``. ``unpad_inputs`` and
``use_memory_efficient_attention`` choose kernels, not numbers (on real tokens): they are kept and written back.
Native ``gte`` configs get transformers' rope types ``default`` and ``linear``: fixed NTK scaling by ``k`` is
linear scaling of the base ``θ·k`` by ``k^(2/d)`` (the same frequencies), which is how bertblocks writes a GTE with
NTK scaling for transformers' ``GteConfig``; the other types compute other frequencies and are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family, RemoteCode
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import Drop, Join, KeyMap, Rename, Split

from ..errors import InputError
from ._rotary_config import ROPE_FIELDS, ROPE_FIXED, rope_from_hf, rope_to_hf
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .roberta import roberta_tokenizer

#: transformers' GteConfig.default_theta
DEFAULT_THETA = 160000.0
#: GteConfig's defaults where they differ from BERT's (a config.json may leave them out)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 250048,
    "attention_probs_dropout_prob": 0.0,
    "max_position_embeddings": 8192,
    "type_vocab_size": 1,
    "pad_token_id": 1,
}
#: the task classes whose backbone is built with its pooler (``GteModel`` itself has none)
_POOLED = ("GteForSequenceClassification", "NewForSequenceClassification")


def _in_memory_rules(prefix: str) -> tuple[Join | Rename, ...]:
    """transformers' own names, in checkpoints its GTE classes save with ``save_original_format=False``
    (``{prefix}.layers.{i}.self_attn.q_proj``, ``mlp.gate_proj``, ``lm_head.layer_norm``, …): read, never written
    (the published names' rules come first and match every model key)."""
    layer, ours = f"{prefix}.layers.{{i}}", "bert.encoder.layer.{i}"
    return (
        Join(tuple(f"{layer}.self_attn.{p}_proj" for p in "qkv"), f"{ours}.attention.self.Wqkv"),
        Rename(f"{layer}.self_attn.o_proj", f"{ours}.attention.output.dense"),
        Rename(f"{layer}.post_attention_layernorm", f"{ours}.attention.output.LayerNorm"),
        Rename(f"{layer}.mlp.up_proj", f"{ours}.intermediate.up"),
        Rename(f"{layer}.mlp.gate_proj", f"{ours}.intermediate.gate"),
        Rename(f"{layer}.mlp.down_proj", f"{ours}.output.dense"),
        Rename(f"{layer}.post_mlp_layernorm", f"{ours}.output.LayerNorm"),
        Rename("lm_head.layer_norm", "cls.predictions.transform.LayerNorm"),
    )


def key_map(prefix: str) -> KeyMap:
    """The GTE checkpoint layout with the backbone under ``prefix`` (``gte``: transformers'; ``new``: published)."""
    layer, ours = f"{prefix}.encoder.layer.{{i}}", "bert.encoder.layer.{i}"
    return KeyMap(
        prefix=prefix,
        rules=(
            Rename(f"{layer}.attention.qkv_proj", f"{ours}.attention.self.Wqkv"),
            Rename(f"{layer}.attention.o_proj", f"{ours}.attention.output.dense"),
            Rename(f"{layer}.attn_ln", f"{ours}.attention.output.LayerNorm"),
            # up rows first, then gate rows (transformers' conversion chunks it into up_proj, gate_proj)
            Split(f"{layer}.mlp.up_gate_proj", (f"{ours}.intermediate.up", f"{ours}.intermediate.gate")),
            Rename(f"{layer}.mlp.down_proj", f"{ours}.output.dense"),
            Rename(f"{layer}.mlp_ln", f"{ours}.output.LayerNorm"),
            Rename("lm_head.dense", "cls.predictions.transform.dense"),
            Rename("lm_head.norm", "cls.predictions.transform.LayerNorm"),
            # GteLMHead has no separate bias: the decoder's own bias is the one BERT's head ties to its decoder
            Rename("lm_head.decoder.bias", "cls.predictions.bias"),
            Rename("lm_head.decoder", "cls.predictions.decoder"),
            # rotary tables recomputed from the config (transformers ignores them on load too: inv_freq)
            Drop(f"{prefix}.embeddings.rotary_emb"),
            Drop(f"{prefix}.rotary_emb"),
            *(_in_memory_rules(prefix) if prefix == "gte" else ()),
        ),
        head_prefixes=("lm_head.", "classifier."),
    )


FIXED: dict[str, Any] = {
    **ROPE_FIXED,
    "encoder.layer.name": "post_ln",
    "encoder.attention.name": "bert",
    "encoder.attention.fused_qkv": True,
    "encoder.attention.qkv_bias": True,
    "encoder.attention.output_bias": True,
    "encoder.feedforward.name": "glu",
    "encoder.feedforward.bias": True,
    "encoder.feedforward.input_bias": False,
    "encoder.feedforward.fused": False,
    "encoder.feedforward.dropout_at": "both",
    "is_decoder": False,
    "add_cross_attention": False,
}


def _components(src: dict[str, Any], position: dict[str, Any]) -> dict[str, Any]:
    """The BERT fields of ``src`` (GteConfig's names) and GTE's components, ``position`` the rope spec."""
    for absent in ("is_decoder", "add_cross_attention", "use_cache"):  # GteConfig has none of them
        src.pop(absent, None)
    architectures = src.get("architectures")
    if src.get("tie_word_embeddings") is False and architectures in (["GteForMaskedLM"], ["NewForMaskedLM"]):
        # the checkpoint then stores the decoder's own bias under the name the tied head's bias has
        raise InputError(
            "tie_word_embeddings is false: an untied GTE masked-LM head is not built (its decoder bias would load "
            "into the tied head's unused bias)"
        )
    data = bert_fields_from_hf(src)
    data["position"] = position
    # GTE's components (fused QKV, GeGLU, post-LN): FIXED, applied by the translator.
    # GteModel builds no pooler; only the sequence classifier asks for one
    pooled = isinstance(architectures, list) and len(architectures) == 1 and architectures[0] in _POOLED
    data["pooler"] = "first_token" if pooled else None
    return data


def _head_dim(src: Mapping[str, Any]) -> int:
    """The rotated width (GteConfig's head size) of a config.json, with GteConfig's defaults (768 / 12)."""
    hidden, heads = src.get("hidden_size", 768), src.get("num_attention_heads", 12)
    if isinstance(hidden, bool) or isinstance(heads, bool) or not isinstance(hidden, int) or not isinstance(heads, int):
        raise InputError(f"hidden_size {hidden!r} and num_attention_heads {heads!r} must be integers")
    return hidden // max(heads, 1)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    params = src.get("rope_parameters")
    linear = isinstance(params, Mapping) and params.get("rope_type") == "linear"
    factor = 1.0
    if linear:  # NTK scaling in transformers' terms (see _to_hf): read back as the same frequencies
        rest = dict(params)
        factor = rest.pop("factor", None)
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor < 1.0:
            raise InputError(f"rope_parameters.factor must be a number >= 1, got {factor!r}")
        src["rope_parameters"] = {**rest, "rope_type": "default"}
    position = rope_from_hf(src, DEFAULT_THETA)
    if linear and factor != 1.0:
        # to 12 digits: what bertblocks wrote (k^(2/d) of a decimal k) reads back as that k, not one ulp off it
        k = float(f"{float(factor) ** (_head_dim(src) / 2):.12g}")
        position = {**position, "base": float(f"{position['base'] / k:.12g}"), "ntk_factor": k}
    return _components(src, position)


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type", "is_decoder", "add_cross_attention"))
    out.update(rope_to_hf(config))
    options = config.position.options()
    k = options.get("ntk_factor", 1.0)
    if k != 1.0:
        # fixed NTK scaling, θ_i = (base·k)^(-2i/d) / k^(2/d), is transformers' linear scaling of the base base·k by
        # the factor k^(2/d) (its inv_freq = (base·k)^(-2i/d) / factor): the same frequencies, which GteConfig reads
        d = config.hidden_size // config.encoder.attention.num_heads
        theta = float(options["base"]) * k
        out["rope_parameters"] = {"rope_theta": theta, "rope_type": "linear", "factor": k ** (2 / d)}
    return out


# ------------------------------------------------------------------------------ Alibaba's format (``new``)
#: switches of the published config.json that bertblocks builds at one value only: field → that value (also what
#: a config.json without the field is read as; every published one states them)
REQUIRED: dict[str, Any] = {
    "position_embedding_type": "rope",
    "layer_norm_type": "layer_norm",
    "pack_qkv": True,
    "logn_attention_scale": False,
    "logn_attention_clip1": False,
}
#: why each value of :data:`REQUIRED` is the only one
_WHY = {
    "position_embedding_type": "GTE's weights were trained with rotary positions; no position table exists",
    "layer_norm_type": "its other norm is not described by config.json fields bertblocks can check",
    "pack_qkv": "separate q/k/v projections are stored under names no published checkpoint shows",
    "logn_attention_scale": "log-length attention scaling is not a bertblocks attention",
    "logn_attention_clip1": "log-length attention scaling is not a bertblocks attention",
}
#: the published architectures → transformers' GTE classes (the same modules and weights)
NEW_ARCHITECTURES = {
    "NewModel": "GteModel",
    "NewForMaskedLM": "GteForMaskedLM",
    "NewForSequenceClassification": "GteForSequenceClassification",
    "NewForTokenClassification": "GteForTokenClassification",
}


#: the remote code of the published config.json (Alibaba's repository; the config and every task class): what its
#: ``auto_map`` may name
NEW_REMOTE_CODE = RemoteCode(
    "Alibaba-NLP/new-impl",
    frozenset(
        {
            "configuration.NewConfig",
            *(f"modeling.{name}" for name in NEW_ARCHITECTURES),
            "modeling.NewForQuestionAnswering",
            "modeling.NewForMultipleChoice",
        }
    ),
)


def _scaling(rope_scaling: Any) -> float:
    """The NTK factor of a published ``rope_scaling`` (1.0 for none).

    Raises:
        ValueError: a scaling that is not fixed NTK, naming the field.
    """
    if rope_scaling is None:
        return 1.0
    if not isinstance(rope_scaling, Mapping):
        raise InputError(f"rope_scaling must be a mapping or null, got {rope_scaling!r}")
    kind = rope_scaling.get("type", rope_scaling.get("rope_type"))
    if kind != "ntk":
        raise InputError(f"rope_scaling.type is {kind!r}; bertblocks builds GTE's fixed NTK scaling ('ntk') only")
    if rope_scaling.get("mixed_b") is not None:
        raise InputError(
            f"rope_scaling.mixed_b is {rope_scaling['mixed_b']!r}: mixed NTK scaling is not implemented (fixed only)"
        )
    unknown = sorted(set(rope_scaling) - {"type", "rope_type", "factor", "mixed_b"})
    if unknown:
        raise InputError(f"rope_scaling has fields bertblocks cannot represent: {', '.join(unknown)}")
    factor = rope_scaling.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or factor < 1.0:
        raise InputError(f"rope_scaling.factor must be a number >= 1, got {factor!r}")
    return float(factor)


def _new_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = dict(hf)
    problems = []
    for field, required in REQUIRED.items():
        value = src.pop(field, required)
        if value != required or isinstance(value, bool) != isinstance(required, bool):
            problems.append(f"{field} is {value!r}, bertblocks builds {required!r} only ({_WHY[field]})")
    if "rope_theta" not in src:
        problems.append("rope_theta is missing (its default lives in remote code, which bertblocks never reads)")
    if problems:
        raise InputError("cannot build this GTE config.json: " + "; ".join(problems))
    theta = src.pop("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, int | float):
        raise InputError(f"rope_theta must be a number, got {theta!r}")
    factor = _scaling(src.pop("rope_scaling", None))
    position: dict[str, Any] = {"base": float(theta)}  # a rope scheme: FIXED
    if factor != 1.0:
        position["ntk_factor"] = factor
    return _components(src, position)


def _new_to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type", "is_decoder", "add_cross_attention"))
    options = config.position.options()
    factor = options.get("ntk_factor", 1.0)
    out["rope_theta"] = float(options.get("base", 10000.0))
    out["rope_scaling"] = {"type": "ntk", "factor": float(factor)} if factor != 1.0 else None
    out.update(REQUIRED)
    return out


#: GteConfig's fields: BERT's and the rotary ones
FIELDS = {**BERT_FIELDS, **ROPE_FIELDS}
#: the published format's fields: BERT's, its rotary base and NTK scaling, and its switches (one value each works)
NEW_FIELDS = {
    **BERT_FIELDS,
    "rope_theta": HFField(float, gt=0),
    "rope_scaling": HFField(dict, nullable=True),
    "position_embedding_type": HFField(str),
    "layer_norm_type": HFField(str),
    "pack_qkv": HFField(bool),
    "logn_attention_scale": HFField(bool),
    "logn_attention_clip1": HFField(bool),
}

GTE = Family(
    model_type="gte",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=key_map("gte"),
    architectures={
        "GteForMaskedLM": "masked_lm_gelu",
        "GteForSequenceClassification": "sequence_classification",
        "GteForTokenClassification": "token_classification",
    },
    base_architecture="GteModel",
    fixed=FIXED,
    description="GTE (transformers' gte): post-LN with RoPE, fused biased QKV, GeGLU, no pooler",
    # transformers maps gte to XLMRobertaTokenizer (gte-multilingual-base's); chosen by model_type only
    tokenizer=replace(roberta_tokenizer("XLMRoberta"), tokenizer_classes=()),
)

NEW = Family(
    model_type="new",
    config_from_hf=_new_from_hf,
    config_to_hf=_new_to_hf,
    fields=NEW_FIELDS,
    example_config={"rope_theta": 10000.0},  # every published one states it (its default lives in remote code)
    key_map=key_map("new"),
    architectures={new: GTE.architectures[ours] for new, ours in NEW_ARCHITECTURES.items() if ours != "GteModel"},
    base_architecture="NewModel",
    fixed=FIXED,
    description="GTE in Alibaba's published format (model_type new): RoPE with NTK scaling, GeGLU, post-LN",
    # gte-*-en-v1.5 ship BERT's WordPiece vocabulary (gte-multilingual-base XLM-R's, framed by its tokenizer.json);
    # chosen by model_type only
    tokenizer=replace(BERT_TOKENIZER, tokenizer_classes=()),
    # the published config.json (with its auto_map) is translated field by field, every switch checked
    remote_code=(NEW_REMOTE_CODE,),
)


def bertblocks_register_components() -> list[Component]:
    return [
        Component("family", family.model_type, (lambda family=family, **_: family), description=family.description)
        for family in (GTE, NEW)
    ]
