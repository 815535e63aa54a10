"""Typed config.json fields, from each family's declaration (``Family.fields``): every registered family, third-party
ones included, is fuzzed on every declared field with no test code of its own
(:func:`bertblocks.testing.family_fields.fuzz_family_fields`); planted families show that the fuzzing catches a field
read without declaring it and a declared field read carelessly; and the findings of the loose translators (the
string ``"false"`` read as true) are refused, naming the field."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

import bertblocks
from bertblocks.config import BertConfig, ConfigError
from bertblocks.core.component import Component
from bertblocks.families.bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from bertblocks.families.family import Family
from bertblocks.families.fields import HFField, UndeclaredFieldWarning
from bertblocks.families.keymap import KeyMap
from bertblocks.hf.config_json import MAX_DEPTH, config_from_hf
from bertblocks.hf.misspelt_keys import UnknownConfigKeyWarning
from bertblocks.registry import Registry, get_registry, set_registry
from bertblocks.testing.family_fields import fuzz_family_fields


def _registered() -> list[str]:
    """Every family of the registry a user gets (built-ins and installed plugins' entry points)."""
    return sorted(component.name for component in Registry().components("family"))


@pytest.mark.parametrize("model_type", _registered())
def test_every_registered_family_holds_to_its_declaration(model_type):
    problems = fuzz_family_fields(model_type)
    assert not problems, "\n".join(problems)


def test_every_family_that_reads_fields_declares_them():
    # the hybrid carries everything under `bertblocks`; every other family reads transformers' fields
    undeclared = [f.name for f in get_registry().components("family") if f.name != "bertblocks-hybrid"]
    from bertblocks.hf.families import get_family

    assert [name for name in undeclared if not get_family(name).fields] == []


# ------------------------------------------------------------------------------------------- planted families
def _family(model_type: str, from_hf: Any, to_hf: Any, fields: Mapping[str, HFField]) -> Registry:
    family = Family(
        model_type=model_type,
        config_from_hf=from_hf,
        config_to_hf=to_hf,
        fields=fields,
        key_map=KeyMap(prefix="bert"),
    )
    registry = Registry(load_entry_points=False)
    registry.register(
        SimpleNamespace(bertblocks_register_components=lambda: [Component("family", model_type, lambda **_: family)]),
        name=f"{model_type}-plugin",
    )
    set_registry(registry)
    return registry


def _loose_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    src = dict(hf)
    pooled = bool(src.pop("my_pooler", True))  # "false" is True here: the bug a declaration prevents
    data = bert_fields_from_hf(src)
    if not pooled:
        data["pooler"] = None
    return data


def _loose_to_hf(config: BertConfig) -> dict[str, Any]:
    return {**bert_fields_to_hf(config), "my_pooler": config.pooler is not None}


def test_a_family_reading_a_field_it_does_not_declare_is_caught():
    registry = _family("loosebert", _loose_from_hf, _loose_to_hf, BERT_FIELDS)
    problems = fuzz_family_fields("loosebert", registry)
    assert len(problems) == 1
    assert "does not declare (my_pooler)" in problems[0]
    with pytest.warns(UndeclaredFieldWarning, match=r"loosebert family read config.json fields .* \(my_pooler\)"):
        config_from_hf({"model_type": "loosebert", "my_pooler": "false"}, registry)


def test_the_same_family_declaring_the_field_is_strict_and_passes():
    registry = _family("strictbert", _loose_from_hf, _loose_to_hf, {**BERT_FIELDS, "my_pooler": HFField(bool)})
    assert fuzz_family_fields("strictbert", registry) == []
    with pytest.raises(ConfigError) as refused:
        config_from_hf({"model_type": "strictbert", "my_pooler": "false"}, registry)
    assert [issue.loc for issue in refused.value.issues] == ["my_pooler"]
    assert "my_pooler='false'" in str(refused.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndeclaredFieldWarning)
        assert bertblocks.load_config(config_from_hf({"model_type": "strictbert", "my_pooler": False})).pooler is None


def test_a_declared_field_read_carelessly_is_caught():
    def from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
        src = dict(hf)
        groups = src.pop("my_groups", 1)
        data = bert_fields_from_hf(src)
        data["hidden_size"] = 768 // groups * groups  # a declared int, but no range: 0 divides by zero
        return data

    registry = _family("carelessbert", from_hf, bert_fields_to_hf, {**BERT_FIELDS, "my_groups": HFField(int)})
    problems = fuzz_family_fields("carelessbert", registry)
    assert any("my_groups=0 raised ZeroDivisionError" in p for p in problems), problems


# ------------------------------------------------------------------------------------------------ the findings
#: the boolean fields the translators read with bool(): "false" was true
BOOLEANS = [
    ("deberta-v2", "relative_attention"),
    ("deberta-v2", "share_att_key"),
    ("deberta-v2", "position_biased_input"),
    ("roformer", "rotary_value"),
    ("esm", "token_dropout"),
    ("esm", "emb_layer_norm_before"),
]


@pytest.mark.parametrize(
    ("model_type", "field", "value"),
    [
        (model_type, field, value)
        for model_type, field in BOOLEANS
        for value in ("false", "true", "0", 1, None)
        if not (value is None and field == "emb_layer_norm_before")  # EsmConfig's default is null: read as false
    ],
)
def test_a_boolean_field_takes_booleans_only(model_type, field, value):
    with pytest.raises(ConfigError) as refused:
        config_from_hf({"model_type": model_type, field: value})
    assert [issue.loc for issue in refused.value.issues] == [field]
    assert "must be a boolean" in str(refused.value)


@pytest.mark.parametrize(
    ("model_type", "field", "value"),
    [
        ("deberta-v2", "conv_kernel_size", 1.5),
        ("deberta-v2", "conv_kernel_size", -3),
        ("deberta-v2", "position_buckets", "256"),
        ("deberta-v2", "pos_att_type", [1]),
        ("albert", "num_hidden_groups", 0),
        ("mpnet", "relative_attention_num_buckets", True),
        ("modernbert", "local_attention", -1),
        ("distilbert", "n_layers", "6"),
    ],
)
def test_sizes_and_lists_are_typed_by_the_declaration(model_type, field, value):
    with pytest.raises(ConfigError) as refused:
        config_from_hf({"model_type": model_type, field: value})
    assert [issue.loc for issue in refused.value.issues] == [field]


def test_a_misspelt_family_field_gets_a_did_you_mean_from_the_declaration():
    with pytest.warns(UnknownConfigKeyWarning, match="did you mean 'relative_attention'"):
        config_from_hf({"model_type": "deberta-v2", "relative_atention": True})
    with pytest.warns(UnknownConfigKeyWarning, match="did you mean 'n_layers'"):
        config_from_hf({"model_type": "distilbert", "n_layer": 2})


def test_a_deeply_nested_config_json_is_a_clear_error_not_a_recursion_error():
    nested: Any = {}
    for _ in range(200_000):
        nested = {"a": nested}
    with pytest.raises(ConfigError, match=f"nests deeper than {MAX_DEPTH} levels"):
        config_from_hf({"model_type": "bert", "task_specific_params": nested})
    deep_list: Any = []
    for _ in range(200_000):
        deep_list = [deep_list]
    with pytest.raises(ConfigError, match="nests deeper"):
        config_from_hf({"model_type": "bert", "x": deep_list})
