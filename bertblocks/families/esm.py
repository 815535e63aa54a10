"""ESM-1b / ESM-2 (``model_type: esm``): protein language models; pre-LN layers, rotary positions (ESM-2).

What differs from BERT, as components: embedding ``esm`` (token embeddings; ``token_dropout``: mask tokens zeroed
and every embedding rescaled by ``(1 - 0.15·0.8) / (1 - the row's share of mask tokens)``, in training and
evaluation alike, as transformers does; a LayerNorm only with ``emb_layer_norm_before``; padded positions zeroed;
no token types, no dropout; ``inputs_embeds`` skip it all, as ``EsmModel`` skips its embeddings); layer ``pre_ln``
(``x + attn(LN(x))``, ``x + ff(LN(x))``) with the final norm ``emb_layer_norm_after``; ``position_embedding_type:
rotary`` is the ``rope`` scheme (halves, ``base`` = ``rope_theta``) with ``table: inv_freq`` (the stored inverse
frequencies are the ones used); ``absolute`` (ESM-1b) is a learned table with RoBERTa's positions past the
padding index; the feed-forward activation is erf GELU whatever ``hidden_act`` says (ESM's ``gelu``).

The checkpoint: prefix ``esm.``; ``encoder.layer.{i}.attention.LayerNorm`` ↔ ``attention_norm``,
``encoder.layer.{i}.LayerNorm`` ↔ ``feedforward_norm`` (written ``.gamma``/``.beta``, as transformers 5 writes ESM's
LayerNorms; ``.weight``/``.bias`` read too); ``encoder.emb_layer_norm_after`` ↔ ``encoder.final_norm``;
``embeddings.layer_norm`` as it is; the inverse frequencies ``rotary_embeddings.inv_freq`` ↔
``encoder.rotary_embeddings.inv_freq`` (written under transformers 5's one key
``encoder.layer.*.attention.self.rotary_embeddings.inv_freq``; older per-layer copies read from layer 0, the rest
dropped, as transformers' load hook does); ``lm_head.{dense,layer_norm,bias}`` ↔ ``cls.predictions.…`` (the
decoder is the tied embedding table).

Not built, and said so: the contact-prediction head (``predict_contacts``) and ESMFold (``is_folding_model``).
``EsmModel`` always holds ``contact_head.regression`` (``layers × heads`` inputs); bertblocks keeps those weights
frozen at ``embeddings.contact_head`` so that checkpoints round-trip, and never runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError
from bertblocks.families.family import Family, TokenizerConvention
from bertblocks.families.keymap import Drop, KeyMap, Rename

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .fields import HFField
from .roberta import LM_HEAD_RULES

#: EsmConfig's defaults where they differ from BERT's (a config.json without the field means these)
DEFAULTS: dict[str, Any] = {"max_position_embeddings": 1026, "pad_token_id": None}
DEFAULT_THETA = 10000.0

_L, _O = "esm.encoder.layer.{i}", "bert.encoder.layer.{i}"
_INV_FREQ = "bert.encoder.rotary_embeddings.inv_freq"
KEY_MAP = KeyMap(
    prefix="esm",
    rules=(
        # transformers 5 saves the shared inverse frequencies under one literal wildcard key (its conversion
        # mapping reverted); older checkpoints hold one copy per layer, of which layer 0's is read
        Rename("esm.encoder.layer.*.attention.self.rotary_embeddings.inv_freq", _INV_FREQ),
        Rename("esm.encoder.layer.0.attention.self.rotary_embeddings.inv_freq", _INV_FREQ),
        Drop(f"{_L}.attention.self.rotary_embeddings"),
        Rename("esm.rotary_embeddings", "bert.encoder.rotary_embeddings"),  # transformers' in-memory name
        # the pre-LN norms, written as transformers 5 writes them (LayerNorm.gamma/beta), read either way
        Rename(f"{_L}.attention.LayerNorm.gamma", f"{_O}.attention_norm.weight"),
        Rename(f"{_L}.attention.LayerNorm.beta", f"{_O}.attention_norm.bias"),
        Rename(f"{_L}.attention.LayerNorm", f"{_O}.attention_norm"),
        Rename(f"{_L}.LayerNorm.gamma", f"{_O}.feedforward_norm.weight"),
        Rename(f"{_L}.LayerNorm.beta", f"{_O}.feedforward_norm.bias"),
        Rename(f"{_L}.LayerNorm", f"{_O}.feedforward_norm"),
        Rename("esm.encoder.emb_layer_norm_after", "bert.encoder.final_norm"),
        Rename("esm.contact_head", "bert.embeddings.contact_head"),
        *LM_HEAD_RULES,
    ),
    head_prefixes=("lm_head.", "classifier."),
)

FIXED: dict[str, Any] = {
    "embedding.name": "esm",
    "embedding.inputs_embeds_as_is": True,  # EsmModel skips its embeddings for inputs_embeds
    "encoder.layer.name": "pre_ln",
    "encoder.feedforward.activation": "gelu",  # ESM's layers use erf GELU whatever hidden_act says
    "is_decoder": False,
    "add_cross_attention": False,
}
_POSITIONS = ("rotary", "absolute")


class EsmConfigError(BertBlocksError, ValueError):
    """An ESM ``config.json`` field bertblocks does not implement."""


def _from_hf(hf: Any) -> dict[str, Any]:
    src = {**DEFAULTS, **hf}
    if src.pop("is_folding_model", False):
        raise EsmConfigError("esm config.json: is_folding_model=True is not supported: ESMFold is not implemented")
    for absent in ("esmfold_config", "vocab_list", "hidden_act"):  # ESM's layers use erf GELU whatever it says
        src.pop(absent, None)
    kind = src.pop("position_embedding_type", "absolute") or "absolute"
    if kind not in _POSITIONS:
        raise EsmConfigError(
            f"esm config.json: position_embedding_type={kind!r} is not supported: transformers' ESM has rotary "
            "and absolute"
        )
    theta = src.pop("rope_theta", DEFAULT_THETA)
    embedding = {  # besides FIXED's name and inputs_embeds_as_is, which the translator applies
        # booleans (FIELDS; the translator checks them first); EsmConfig's emb_layer_norm_before defaults to null
        "norm": src.pop("emb_layer_norm_before", False) or False,
        "token_dropout": src.pop("token_dropout", False),
        "mask_token_id": src.pop("mask_token_id", None),
    }
    layers, heads = src.get("num_hidden_layers", 12), src.get("num_attention_heads", 12)
    if isinstance(layers, int) and isinstance(heads, int):  # otherwise validation refuses the field itself
        # EsmModel's contact head reads every layer's every head's attention map
        embedding["contact_head_features"] = layers * heads
    unused = {k: src.pop(k) for k in ("classifier_dropout",) if k in src}  # EsmConfig has no such field
    data = bert_fields_from_hf(src)
    data["hf"].update(unused)
    data["type_vocab_size"] = 0  # no token types: token_type_ids are ignored
    data["embedding"] = {**data["embedding"], **embedding}
    if kind == "rotary":
        data["position"] = {"name": "rope", "base": float(theta), "table": "inv_freq"}
    else:
        data["position"] = {"name": "absolute"}
        if theta != DEFAULT_THETA:
            data["hf"]["rope_theta"] = theta  # unused by absolute positions; kept for the round trip
    # EsmModel builds a pooler; its task classes build none
    architectures = hf.get("architectures")
    data["pooler"] = "first_token" if not architectures or architectures == ["EsmModel"] else None
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    dropped = ("position_embedding_type", "type_vocab_size", "classifier_dropout", "hidden_act")
    out = bert_fields_to_hf(config, dropped=dropped)
    for key in ("classifier_dropout", "rope_theta"):
        if key in config.hf:
            out[key] = config.hf[key]
    if config.position.name == "rope":
        out["position_embedding_type"] = "rotary"
        out["rope_theta"] = float(config.position.options().get("base", DEFAULT_THETA))
    else:
        out["position_embedding_type"] = "absolute"
    e = config.embedding.options()
    out.update(
        emb_layer_norm_before=bool(e.get("norm", False)),
        token_dropout=bool(e.get("token_dropout", False)),
        mask_token_id=e.get("mask_token_id"),
    )
    return out


def esm_vocab_pipeline(vocab: Mapping[str, int], special: Mapping[str, str]) -> Any:
    """EsmTokenizer's split over its ``vocab.txt``: every vocabulary entry is cut out where it occurs (a residue is
    one character, so ``MKT`` is three tokens), what is left is split at whitespace, and each remaining word is one
    token (``<unk>`` unless it is in the vocabulary); nothing is lower-cased. The caller has checked that the
    ``special`` tokens are in ``vocab``.
    """
    import re

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    entries = sorted((token for token in vocab if token), key=len, reverse=True)  # the longest entry first
    tokenizer = Tokenizer(models.WordLevel(dict(vocab), unk_token=special["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("|".join(re.escape(token) for token in entries)), "isolated"),
            pre_tokenizers.WhitespaceSplit(),
        ]
    )
    tokenizer.add_special_tokens(list(dict.fromkeys(special.values())))
    return tokenizer


#: EsmTokenizer's framing: ``<cls> A <eos>`` and ``<cls> A <eos> B <eos>`` (no separator token), no token types.
#: ESM checkpoints ship a ``vocab.txt`` of amino acids and specials, no ``tokenizer.json``: bertblocks builds
#: EsmTokenizer's split over it (one token per residue: :func:`esm_vocab_pipeline`).
ESM_TOKENIZER = TokenizerConvention(
    special_tokens={
        "unk_token": "<unk>",
        "sep_token": "<eos>",
        "pad_token": "<pad>",
        "cls_token": "<cls>",
        "mask_token": "<mask>",
    },
    single="<cls> $A <eos>",
    pair="<cls> $A <eos> $B <eos>",
    model_input_names=("input_ids", "attention_mask"),
    tokenizer_classes=("EsmTokenizer",),
    from_vocab=esm_vocab_pipeline,
)

#: EsmConfig's fields: BERT's and ESM's own (ESMFold's refused, its folding config and vocabulary list unused)
FIELDS = {
    **BERT_FIELDS,
    "is_folding_model": HFField(bool),
    "esmfold_config": HFField(dict, nullable=True),
    "vocab_list": HFField(list, items=str, nullable=True),
    "hidden_act": HFField(str, nullable=True),
    "rope_theta": HFField(float, gt=0),
    "emb_layer_norm_before": HFField(bool, nullable=True),
    "token_dropout": HFField(bool),
    "mask_token_id": HFField(int, ge=0, nullable=True),
}

ESM = Family(
    model_type="esm",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "EsmForMaskedLM": "masked_lm_gelu",
        "EsmForSequenceClassification": {"name": "dense_classification", "activation": "tanh"},
        "EsmForTokenClassification": "token_classification",
    },
    base_architecture="EsmModel",
    fixed=FIXED,
    description="ESM-1b/ESM-2: pre-LN, rotary positions from stored inverse frequencies, token dropout, no token types",
    tokenizer=ESM_TOKENIZER,
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "esm", lambda **_: ESM, description=ESM.description)]
