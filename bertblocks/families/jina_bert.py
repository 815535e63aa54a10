"""Jina-embeddings-v2 (JinaBERT): published as ``model_type: bert`` with an ``auto_map`` naming remote-code
``JinaBert*`` classes (``jinaai/jina-bert-implementation``), translated here into bertblocks components. No code
from a checkpoint is ever imported or run: this module reads the config.json fields and the weight names.

What differs from BERT, as components (from the published config fields and modelling description):

* position ``symmetric_alibi`` (``position_embedding_type: "alibi"``): no position table; every layer adds
  ``-m_h · |i - j|`` to its scaled scores, ``m_h`` the ALiBi paper's slopes for the head count;
* feed-forward ``glu`` (``feed_forward_type: "geglu"`` or ``"reglu"``): JinaBERT's ``mlp.gated_layers`` is one
  bias-free projection to ``2·intermediate_size`` whose first half is activated (GELU for geglu, ReLU for reglu)
  and multiplies the second; ``mlp.wo`` (with bias) projects back; ``mlp.layernorm`` normalises
  ``wo(…) + residual``: BERT's post-LN output, so it is the layer's ``output.LayerNorm`` here (the same
  equation). JinaBERT drops out the gated product before ``wo``: the glu option ``dropout_at: gated``;
* everything else is BERT's: embeddings (word + token type → LayerNorm), post-LN layers, attention with biased
  query/key/value, pooler, heads and their weight names (prefix ``bert.``).

``transformers`` itself, given such a config.json without ``trust_remote_code``, builds a plain ``BertModel``:
the ``mlp.*`` weights are reported unexpected, the BERT feed-forward and position table stay random, so its
numbers are not the model's. bertblocks therefore never reads this format as the ``bert`` family: the family
below claims it (through its ``auto_map``), and saving writes the same format back (``model_type: bert``, the
``auto_map``, ``position_embedding_type: alibi``, ``feed_forward_type``), which loads in bertblocks and, with
remote code, in transformers. Any other remote code under ``model_type: bert`` (the ``-base-code`` model's
``jinaai/jina-bert-v2-qk-post-norm`` with its query/key norms, the older ``JBert`` classes) stays refused.
"""

from __future__ import annotations

from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family, RemoteCode
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import KeyMap, Rename

from ..errors import InputError
from .bertlike import BERT_FIELDS, POSITION_FIELD, bert_fields_from_hf, bert_fields_to_hf

#: the published remote code this family implements (other repositories' JinaBert classes differ)
REMOTE_REPOSITORY = "jinaai/jina-bert-implementation"
#: the auto_map entries of the published checkpoints, written back on save
AUTO_MAP: dict[str, str] = {
    "AutoConfig": f"{REMOTE_REPOSITORY}--configuration_bert.JinaBertConfig",
    "AutoModel": f"{REMOTE_REPOSITORY}--modeling_bert.JinaBertModel",
    "AutoModelForMaskedLM": f"{REMOTE_REPOSITORY}--modeling_bert.JinaBertForMaskedLM",
    "AutoModelForSequenceClassification": f"{REMOTE_REPOSITORY}--modeling_bert.JinaBertForSequenceClassification",
}
#: remote classes whose modelling this family reproduces
CLASSES = frozenset(
    {
        "configuration_bert.JinaBertConfig",
        "modeling_bert.JinaBertModel",
        "modeling_bert.JinaBertForMaskedLM",
        "modeling_bert.JinaBertForSequenceClassification",
        "modeling_bert.JinaBertForTokenClassification",
        "modeling_bert.JinaBertForQuestionAnswering",
    }
)
#: JinaBERT's gated feed-forward types → the activation of their gate
GATED = {"geglu": "gelu", "reglu": "relu"}
#: config.json's name of the ALiBi scheme ↔ bertblocks'
ALIBI = ("alibi", "symmetric_alibi")

_L, _O = "bert.encoder.layer.{i}.mlp", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="bert",
    rules=(
        # the fused GLU input: the activated half first, as JinaBERT's `gated`/`non_gated` slices
        Rename(f"{_L}.gated_layers", f"{_O}.intermediate.dense"),
        Rename(f"{_L}.wo", f"{_O}.output.dense"),
        # the MLP's own LayerNorm of wo(…) + residual is BERT's post-LN output norm
        Rename(f"{_L}.layernorm", f"{_O}.output.LayerNorm"),
    ),
    head_prefixes=("cls.", "classifier.", "qa_outputs."),
)

FIXED: dict[str, Any] = {
    "encoder.layer.name": "post_ln",
    "encoder.attention.name": "bert",
    "encoder.attention.fused_qkv": False,
    "encoder.attention.qkv_bias": True,
    "encoder.attention.output_bias": True,
    "encoder.feedforward.name": "glu",
    "encoder.feedforward.bias": False,
    "encoder.feedforward.output_bias": True,
    "encoder.feedforward.fused": True,
    "encoder.feedforward.dropout_at": "gated",
    "is_decoder": False,
    "add_cross_attention": False,
}


#: the published remote code: what a config.json's ``auto_map`` may name for this family to read it
REMOTE_CODE = RemoteCode(REMOTE_REPOSITORY, CLASSES)


#: what a config.json says by leaving a field out: JinaBertConfig's defaults for the published format
#: (``model_type: bert``); the published models' values for one that names this family (``model_type: jina_bert``,
#: never published, bertblocks' own)
PUBLISHED_DEFAULTS = {"feed_forward_type": "original", POSITION_FIELD: "absolute"}
OWN_DEFAULTS = {"feed_forward_type": "geglu", POSITION_FIELD: ALIBI[0]}


def _from_hf(hf: Any) -> dict[str, Any]:
    defaults = PUBLISHED_DEFAULTS if hf.get("model_type") == "bert" else OWN_DEFAULTS
    src = {**defaults, **hf}
    problems = []
    feed_forward = src.pop("feed_forward_type")
    if not isinstance(feed_forward, str) or feed_forward not in GATED:
        problems.append(
            f"feed_forward_type is {feed_forward!r}; bertblocks reads JinaBERT's gated MLP ({', '.join(GATED)}), "
            "whose weights are mlp.gated_layers / mlp.wo / mlp.layernorm"
        )
    scaling = src.pop("alibi_scaling", None)
    if scaling not in (None, 1):
        problems.append(f"alibi_scaling is {scaling!r}; only the paper's slopes (1) are implemented")
    activation = GATED.get(feed_forward) if isinstance(feed_forward, str) else None
    hidden_act = src.get("hidden_act", "gelu")
    if activation is not None and hidden_act != activation:
        # hidden_act is the masked-LM transform's activation, the GLU's comes from feed_forward_type: bertblocks
        # has one activation for both
        problems.append(f"hidden_act {hidden_act!r} differs from the {feed_forward} gate's {activation!r}")
    if problems:
        raise InputError("cannot read this Jina-embeddings-v2 config.json: " + "; ".join(problems))
    if src.get(POSITION_FIELD) == ALIBI[0]:
        src[POSITION_FIELD] = ALIBI[1]
    data = bert_fields_from_hf(src)
    # the gated MLP's shape is FIXED (applied by the translator); its activation comes from feed_forward_type
    data["encoder"]["feedforward"] = {**data["encoder"]["feedforward"], "activation": activation}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config)
    if out.get(POSITION_FIELD) == ALIBI[1]:
        out[POSITION_FIELD] = ALIBI[0]
    ff = config.encoder.feedforward
    activation = getattr(ff, "activation", None)
    out["feed_forward_type"] = next((name for name, act in GATED.items() if act == activation), "geglu")
    # a model with another gate activation reads back as geglu: config_to_hf then names the contradiction
    out.setdefault("auto_map", dict(AUTO_MAP))
    out["model_type"] = "bert"  # the published format
    return out


#: JinaBertConfig's fields: BERT's, the gated feed-forward's type and the ALiBi scaling
FIELDS = {**BERT_FIELDS, "feed_forward_type": HFField(str), "alibi_scaling": HFField(float, nullable=True)}

JINA_BERT = Family(
    model_type="jina_bert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "JinaBertForMaskedLM": "masked_lm",
        "JinaBertForSequenceClassification": "sequence_classification",
        "JinaBertForTokenClassification": "token_classification",
        "JinaBertForQuestionAnswering": "question_answering",
    },
    base_architecture="JinaBertModel",
    fixed=FIXED,
    description="Jina-embeddings-v2 (JinaBERT, remote code under model_type bert): BERT with symmetric ALiBi "
    "and a gated (GEGLU) feed-forward",
    tokenizer=BERT_TOKENIZER,  # BertTokenizer; chosen by config.json's model_type (bert)
    remote_code=(REMOTE_CODE,),
    remote_model_types=("bert",),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "jina_bert", lambda **_: JINA_BERT, description=JINA_BERT.description)]
