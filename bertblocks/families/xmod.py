"""X-MOD (``model_type: xmod``): RoBERTa with a bottleneck adapter per language after each feed-forward block,
chosen per sequence by a ``lang_ids`` input (or the ``default_language``).

What differs from RoBERTa: the feed-forward is ``adapters`` (:mod:`bertblocks.plugins.adapters`: ``languages``,
``default_language``, ``reduction_factor`` = ``adapter_reduction_factor``, ``adapter_norm`` from
``adapter_layer_norm`` / ``adapter_reuse_layer_norm``, ``ln_before_adapter``); the checkpoint layout is RoBERTa's,
the adapters at transformers' keys (``encoder.layer.N.output.adapter_modules.<language>.dense1``). X-MOD's
``pre_norm: true`` (pre-LN layers with a final LayerNorm) is refused, naming the field: the published checkpoints
are post-LN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.errors import BertBlocksError

from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .fields import HFField
from .roberta import FIXED, roberta_like


class XmodConfigError(BertBlocksError, ValueError):
    """An X-MOD config.json bertblocks cannot build (the translator reports it as a ConfigError naming the field)."""


#: XmodConfig's fields beyond BERT's, as it types them
ADAPTER_FIELDS: dict[str, HFField] = {
    "pre_norm": HFField(bool, doc="pre-LN layers (refused: the published X-MOD models are post-LN)"),
    "adapter_reduction_factor": HFField(int, ge=1, doc="adapter bottleneck = hidden_size // it"),
    "adapter_layer_norm": HFField(bool, doc="a LayerNorm shared by the adapters before them"),
    "adapter_reuse_layer_norm": HFField(bool, doc="the feed-forward's LayerNorm before the adapters as well"),
    "ln_before_adapter": HFField(bool, doc="the adapters' residual after that norm"),
    "languages": HFField(list, items=str, doc="one adapter per language, in this order (lang_ids index it)"),
    "default_language": HFField(str, nullable=True, doc="the language of inputs without lang_ids"),
}
FIELDS = {**BERT_FIELDS, **ADAPTER_FIELDS}


def _from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = dict(hf)
    if src.pop("pre_norm", False):
        raise XmodConfigError(
            "xmod config.json: pre_norm=True (X-MOD's pre-LN layers) is not supported; the published X-MOD models "
            "are post-LN"
        )
    own_norm = src.pop("adapter_layer_norm", False)
    reuse_norm = src.pop("adapter_reuse_layer_norm", True)
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
    return data


def _to_hf(config: BertConfig) -> dict[str, Any]:
    out = bert_fields_to_hf(config, dropped=("position_embedding_type",))
    options = config.encoder.feedforward.options()
    norm = options.get("adapter_norm", "reuse")
    out.update(
        pre_norm=False,
        adapter_reduction_factor=options.get("reduction_factor", 2),
        adapter_layer_norm=norm == "own",
        adapter_reuse_layer_norm=norm != "none",
        ln_before_adapter=options.get("ln_before_adapter", True),
        languages=list(options.get("languages", ["en_XX"])),
        default_language=options.get("default_language"),
    )
    return out


XMOD = replace(
    roberta_like("xmod", "Xmod", "X-MOD: RoBERTa with a per-language adapter after each feed-forward (lang_ids)"),
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    fixed={**FIXED, "encoder.feedforward.name": "adapters", "encoder.layer.name": "post_ln"},
    example_config={"hidden_size": 32, "num_attention_heads": 4, "languages": ["en_XX", "de_DE"]},
)


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "xmod", lambda **_: XMOD, description=XMOD.description)]
