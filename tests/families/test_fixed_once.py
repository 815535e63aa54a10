"""Each family states a fixed fact once, in ``Family.fixed``: the one config.json translator fills it in, so no
family's own ``config_from_hf`` repeats the value (which could then drift from the declaration unnoticed)."""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

import pytest

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.families.family import Family
from bertblocks.hf import config_json
from bertblocks.hf.families import known_families


def _fixed_values_stated(family: Family) -> list[str]:
    """The ``fixed`` paths that ``family.config_from_hf`` itself sets to the fixed value, for the family's minimal
    config.json (``model_type`` and ``example_config``: no field of the file can have said it) alone and with each
    of its task classes."""
    base = {"model_type": family.model_type, **family.example_config}
    sources = [base, *({**base, "architectures": [name]} for name in family.architectures)]
    stated = set()
    for src in sources:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data: dict[str, Any] = family.config_from_hf(dict(src))
        for path, value in family.fixed.items():
            found = config_json._get(data, path)
            if found is not config_json._MISSING and config_json._same(found, value):
                stated.add(path)
    return sorted(stated)


FAMILIES = [family for family in known_families() if family.fixed]


@pytest.mark.parametrize("family", FAMILIES, ids=[family.model_type for family in FAMILIES])
def test_no_translator_repeats_a_fixed_value(family: Family):
    assert _fixed_values_stated(family) == [], (
        f"{family.model_type}'s config_from_hf sets values Family.fixed already states; leave them out (the "
        "translator fills them in)"
    )


def test_the_check_sees_a_repeated_fixed_value():
    """A translator that writes a fixed value itself is found; one the translator leaves out is not."""

    def repeats(hf: Any) -> dict[str, Any]:
        return {"position": {"name": "absolute"}, "pooler": None}

    planted = dataclasses.replace(
        FAMILIES[0],
        model_type="planted",
        config_from_hf=repeats,
        fixed={"position.name": "absolute", "pooler": None, "embedding.token_types": False},
    )
    assert _fixed_values_stated(planted) == ["pooler", "position.name"]


@pytest.mark.parametrize(
    ("preset", "override", "path"),
    [
        ("tiny-longformer", "encoder.attention={name: bert, num_heads: 4}", "encoder.attention.name"),
        ("tiny-roberta", "embedding.position_offset=none", "embedding.position_offset"),
        ("tiny-convbert", "tie_word_embeddings=false", "tie_word_embeddings"),
    ],
)
def test_saving_refuses_what_loading_would_refuse(preset, override, path, tmp_path):
    """A config against its family's fixed facts is refused when saved, naming the field, and nothing is written:
    loading the folder would refuse it (before, the save succeeded and the folder did not load)."""
    model = bertblocks.create_model(preset, [override])
    with pytest.raises(ConfigError, match=rf"{re.escape(path)}: is .*, but the \S+ family requires"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()
