"""NomicBERT (``model_type: nomic_bert``): BERT's post-LN layers with rotary positions, a SwiGLU feed-forward and
no projection biases.

What differs from BERT, as components: position ``rope`` (halves, whole head, ``θ = rope_theta``, 1000 by
default), no position table; attention ``fused_qkv`` without ``qkv_bias``/``output_bias``; feed-forward ``glu``
without bias, ``fused`` (``act(gate(x)) · up(x)``, the activation ``hidden_act``, SiLU by default); the LayerNorms
keep their biases (one matrix product each for query/key/value and for gate/up). ``NomicBertModel`` has no
pooler, the sequence classifier has BERT's.

The checkpoint is what transformers writes (its ``save_pretrained`` reverts to Nomic's original names):
``nomic_bert.emb_ln``, ``nomic_bert.encoder.layers.{i}.attn.Wqkv`` (query, key, value rows), ``attn.out_proj``,
``norm1``, ``mlp.fc11`` (up), ``mlp.fc12`` (gate), ``mlp.fc2``, ``norm2``; the masked LM's transform norm is
``cls.predictions.transform.layer_norm``. A checkpoint under transformers' in-memory names
(``save_original_format=False``: ``layers.{i}.self_attn.q_proj``, ``mlp.gate_proj``, …) loads too.
"""

from __future__ import annotations

from typing import Any

from bertblocks.config import AttentionSpec, BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import BERT_TOKENIZER, Family, RemoteCode
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import Join, KeyMap, Rename

from ..errors import InputError
from ._nomic_original_config import ORIGINAL_FIELDS, is_original, original_to_transformers
from ._rotary_config import ROPE_FIELDS, ROPE_FIXED, rope_from_hf, rope_to_hf
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf, default

#: transformers' NomicBertConfig.default_theta
DEFAULT_THETA = 1000.0
#: the only head whose transformers class builds NomicBertModel with its pooler
_POOLED = "NomicBertForSequenceClassification"

_L, _N, _O = "nomic_bert.encoder.layers.{i}", "nomic_bert.layers.{i}", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="nomic_bert",
    rules=(
        Rename("nomic_bert.emb_ln", "bert.embeddings.LayerNorm"),
        Rename(f"{_L}.attn.Wqkv", f"{_O}.attention.self.Wqkv"),
        Rename(f"{_L}.attn.out_proj", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.norm1", f"{_O}.attention.output.LayerNorm"),
        # the fused GLU input holds the activated half (fc12, the gate) first, then fc11 (up)
        Join((f"{_L}.mlp.fc12", f"{_L}.mlp.fc11"), f"{_O}.intermediate.dense"),
        Rename(f"{_L}.mlp.fc2", f"{_O}.output.dense"),
        Rename(f"{_L}.norm2", f"{_O}.output.LayerNorm"),
        # NomicBertPredictionHeadTransform renames BERT's LayerNorm (to escape the gamma/beta legacy renames)
        Rename("cls.predictions.transform.layer_norm", "cls.predictions.transform.LayerNorm"),
        # transformers' own names, in checkpoints saved with save_original_format=False: read, never written
        # (the rules above match every model key first)
        Join(tuple(f"{_N}.self_attn.{p}_proj" for p in "qkv"), f"{_O}.attention.self.Wqkv"),
        Rename(f"{_N}.self_attn.o_proj", f"{_O}.attention.output.dense"),
        Rename(f"{_N}.post_attention_layernorm", f"{_O}.attention.output.LayerNorm"),
        Join((f"{_N}.mlp.gate_proj", f"{_N}.mlp.up_proj"), f"{_O}.intermediate.dense"),
        Rename(f"{_N}.mlp.down_proj", f"{_O}.output.dense"),
        Rename(f"{_N}.post_mlp_layernorm", f"{_O}.output.LayerNorm"),
    ),
    head_prefixes=("cls.", "classifier."),
)

FIXED: dict[str, Any] = {
    **ROPE_FIXED,
    "encoder.layer.name": "post_ln",
    "encoder.attention.name": "bert",
    "encoder.attention.fused_qkv": True,
    "encoder.attention.qkv_bias": False,
    "encoder.attention.output_bias": False,
    "encoder.feedforward.name": "glu",
    "encoder.feedforward.bias": False,
    "encoder.feedforward.fused": True,
    "is_decoder": False,
    "add_cross_attention": False,
}


def _from_hf(hf: Any) -> dict[str, Any]:
    if is_original(hf):  # the published checkpoints' remote-code config.json
        hf = original_to_transformers(hf)
    src = dict(hf)
    position = rope_from_hf(src, DEFAULT_THETA)
    head_dim = src.pop("head_dim", None)
    # NomicBertConfig's defaults where they differ from BERT's
    src.setdefault("vocab_size", 30528)
    src.setdefault("hidden_act", "silu")
    src.setdefault("hidden_dropout_prob", 0.0)
    src.setdefault("attention_probs_dropout_prob", 0.0)
    src.setdefault("max_position_embeddings", 2048)
    for absent in ("use_cache", "is_decoder", "add_cross_attention"):  # NomicBertConfig has none of them
        src.pop(absent, None)
    data = bert_fields_from_hf(src)
    heads = data["encoder"]["attention"].get("num_heads", AttentionSpec.model_fields["num_heads"].default)
    hidden = data.get("hidden_size", default("hidden_size"))
    # wrongly typed sizes are the schema's to refuse (naming the field); a head_dim of another type is wrong here
    typed = isinstance(heads, int) and isinstance(hidden, int)
    if head_dim is not None and (not isinstance(head_dim, int) or (typed and head_dim * heads != hidden)):
        raise InputError(
            f"head_dim {head_dim} × num_attention_heads {heads} is not hidden_size {hidden}; bertblocks' "
            "attention has head_dim = hidden_size / num_attention_heads"
        )
    data["position"] = position  # the attention's and feedforward's fixed shape: FIXED, applied by the translator
    # NomicBertModel builds no pooler; only the sequence classifier asks for one
    data["pooler"] = "first_token" if hf.get("architectures") == [_POOLED] else None
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    dropped = ("position_embedding_type", "use_cache", "is_decoder", "add_cross_attention")
    out = bert_fields_to_hf(config, dropped=dropped)
    out.update(rope_to_hf(config))
    out["head_dim"] = config.hidden_size // config.encoder.attention.num_heads
    if out.get("pad_token_id", 0) is None:
        # NomicBertConfig types pad_token_id as an int (null is refused by transformers); Nomic's original configs
        # say null (no padding row). Left out, transformers reads its default 0: the same numbers (the padding row
        # only keeps its gradient at zero in training); bertblocks' null travels in the `bertblocks` block
        del out["pad_token_id"]
    return out


#: NomicBertConfig's fields, and those of Nomic's original format (translated to them first)
FIELDS = {**BERT_FIELDS, **ROPE_FIELDS, "head_dim": HFField(int, ge=1, nullable=True), **ORIGINAL_FIELDS}
#: the classes of Nomic's remote code (``nomic-ai/nomic-bert-2048``), which transformers' NomicBert classes port
NOMIC_CLASSES = frozenset(
    {
        "configuration_hf_nomic_bert.NomicBertConfig",
        *(
            f"modeling_hf_nomic_bert.NomicBert{task}"
            for task in ("Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification")
        ),
        "modeling_hf_nomic_bert.NomicBertForTokenClassification",
    }
)

NOMIC_BERT = Family(
    model_type="nomic_bert",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "NomicBertForMaskedLM": "masked_lm",
        "NomicBertForSequenceClassification": "sequence_classification",
        "NomicBertForTokenClassification": "token_classification",
    },
    base_architecture="NomicBertModel",
    fixed=FIXED,
    description="NomicBERT: post-LN with RoPE, fused bias-free QKV, SwiGLU without biases, no pooler",
    tokenizer=BERT_TOKENIZER,  # transformers maps nomic_bert to BertTokenizer; chosen by model_type only
    # Nomic's original config.json (with its auto_map) is translated field by field, every switch checked
    remote_code=(
        RemoteCode("nomic-ai/nomic-bert-2048", NOMIC_CLASSES, format=is_original),
        RemoteCode(None, NOMIC_CLASSES, format=is_original),  # nomic-bert-2048 holds the code beside its weights
    ),
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "nomic_bert", lambda **_: NOMIC_BERT, description=NOMIC_BERT.description)]
