"""``model_type: bertblocks-hybrid`` — a model no transformers class describes (a hybrid of families, or any config
using components transformers lacks). Its config.json carries the whole bertblocks config under ``bertblocks``
and its checkpoint uses bertblocks' own keys."""

from __future__ import annotations

from typing import Any

from bertblocks.core.component import Component
from bertblocks.families.family import Family
from bertblocks.families.keymap import KeyMap

HYBRID = Family(
    model_type="bertblocks-hybrid",
    config_from_hf=lambda hf: {"hf": {k: v for k, v in hf.items() if k not in ("model_type", "architectures")}},
    config_to_hf=lambda config: dict(config.hf),  # the fields it read back; the rest is the bertblocks block
    key_map=KeyMap(prefix="bert"),
    base_architecture="BertBlocksModel",
    description="a bertblocks model no transformers family describes (hybrids); config under 'bertblocks'",
)


def _factory(**_: Any) -> Family:
    return HYBRID


def bertblocks_register_components() -> list[Component]:
    return [Component("family", "bertblocks-hybrid", _factory, description=HYBRID.description)]
