"""X-MOD (``model_type: xmod``): RoBERTa with a bottleneck adapter per language after each feed-forward block,
chosen per sequence by a ``lang_ids`` input (or the ``default_language``).

What differs from RoBERTa: the feed-forward is ``adapters`` (:mod:`bertblocks.plugins.adapters`: ``languages``,
``default_language``, ``reduction_factor`` = ``adapter_reduction_factor``, ``adapter_norm`` from
``adapter_layer_norm`` / ``adapter_reuse_layer_norm``, ``ln_before_adapter``); the checkpoint layout is RoBERTa's,
the adapters at transformers' keys (``encoder.layer.N.output.adapter_modules.<language>.dense1``).

``pre_norm: true`` (the published checkpoints are post-LN; transformers supports it) is layer ``pre_ln`` with a
final norm: each sub-layer's LayerNorm moves before it, the adapters close the feed-forward sub-layer, and
``encoder.LayerNorm`` follows the stack. The checkpoint keeps the same keys (``attention.output.LayerNorm`` ↔
``attention_norm``, ``output.LayerNorm`` ↔ ``feedforward_norm``, ``encoder.LayerNorm`` ↔ ``encoder.final_norm``),
renamed on load only where the model is pre-LN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError

from ._pre_ln import PreLNLayout
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .fields import HFField
from .keymap import KeyMap
from .roberta import FIXED, HEAD_PREFIXES, LM_HEAD_RULES, roberta_like


class XmodConfigError(BertBlocksError, ValueError):
    """An X-MOD config.json bertblocks cannot build (the translator reports it as a ConfigError naming the field)."""


#: XmodConfig's fields beyond BERT's, as it types them
ADAPTER_FIELDS: dict[str, HFField] = {
    "pre_norm": HFField(bool, doc="pre-LN layers (each LayerNorm before its sub-layer) with a final LayerNorm"),
    "adapter_reduction_factor": HFField(int, ge=1, doc="adapter bottleneck = hidden_size // it"),
    "adapter_layer_norm": HFField(bool, doc="a LayerNorm shared by the adapters before them"),
    "adapter_reuse_layer_norm": HFField(bool, doc="the feed-forward's LayerNorm before the adapters as well"),
    "ln_before_adapter": HFField(bool, doc="the adapters' residual after that norm"),
    "languages": HFField(list, items=str, doc="one adapter per language, in this order (lang_ids index it)"),
    "default_language": HFField(str, nullable=True, doc="the language of inputs without lang_ids"),
}
FIELDS = {**BERT_FIELDS, **ADAPTER_FIELDS}
#: where ``pre_norm: true`` keeps its norms: the post-LN keys, each applied before its sub-layer
PRE_NORM = PreLNLayout(
    attention_norm="output.LayerNorm",
    feedforward_norm="output.LayerNorm",
    final_norm="encoder.LayerNorm",
    embedding_norm=True,
)
KEY_MAP = KeyMap(
    prefix="roberta",
    rules=(*PRE_NORM.rules("roberta", if_model_has=True), *LM_HEAD_RULES),
    head_prefixes=HEAD_PREFIXES,
)


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = dict(hf)
    pre_norm = src.pop("pre_norm", False)
    own_norm = src.pop("adapter_layer_norm", False)
    # beside an own norm the reuse flag changes nothing: kept as the file says (the passthrough), written back as is
    reuse_norm = src.get("adapter_reuse_layer_norm", True) if own_norm else src.pop("adapter_reuse_layer_norm", True)
    adapters = {
        "languages": list(src.pop("languages", ["en_XX"])),
        "default_language": src.pop("default_language", None),
        "reduction_factor": src.pop("adapter_reduction_factor", 2),
        "adapter_norm": "own" if own_norm else ("reuse" if reuse_norm else "none"),
        "ln_before_adapter": src.pop("ln_before_adapter", True),
    }
    data = bert_fields_from_hf(src)
    # RoBERTa's position offset and the adapters' name: Family.fixed, applied by the translator
    data["encoder"]["feedforward"] = {**data["encoder"]["feedforward"], **adapters}
    # pre_ln's defaults are X-MOD's: layer 0's attention input normalised too, a final norm (encoder.LayerNorm)
    data["encoder"]["layer"] = {"name": "pre_ln" if pre_norm else "post_ln"}
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    layer = config.encoder.layer
    pre_norm = layer.name == "pre_ln"
    if pre_norm and (not layer.options().get("first_attention_norm", True) or layer.final_norm is False):
        raise XmodConfigError(
            "xmod config.json: pre_norm=True normalises every layer's attention input and ends the stack with a "
            "LayerNorm; encoder.layer.first_attention_norm: false and encoder.layer.final_norm: false have no "
            "X-MOD field"
        )
    options = config.encoder.feedforward.options()
    norm = options.get("adapter_norm", "reuse")
    out.update(
        pre_norm=pre_norm,
        adapter_reduction_factor=options.get("reduction_factor", 2),
        adapter_layer_norm=norm == "own",
        ln_before_adapter=options.get("ln_before_adapter", True),
        languages=list(options.get("languages", ["en_XX"])),
        default_language=options.get("default_language"),
    )
    if norm != "own":  # beside an own norm, the file's flag (the passthrough) or transformers' default
        out["adapter_reuse_layer_norm"] = norm == "reuse"
    return out


XMOD = replace(
    roberta_like("xmod", "Xmod", "X-MOD: RoBERTa with a per-language adapter after each feed-forward (lang_ids)"),
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    fixed={**FIXED, "encoder.feedforward.name": "adapters"},
    example_config={"hidden_size": 32, "num_attention_heads": 4, "languages": ["en_XX", "de_DE"]},
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "xmod", lambda **_: XMOD, description=XMOD.description)]
