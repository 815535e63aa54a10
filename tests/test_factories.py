"""Each component kind's contract is one row of one table (bertblocks.core.factories.CONTRACTS, the families' row
for ``family``): its typed protocol, the arguments the builder passes, the type it must return. The registry answers
it, the builder checks every component against it, and nothing in the registry probes a factory's signature."""

from __future__ import annotations

import ast
import copy
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ConfigDict
from torch import nn

import bertblocks.registry
from bertblocks import create_model
from bertblocks.config import ComponentSpec
from bertblocks.core.component import KINDS, Component, ComponentKind, NoOptions, subcomponent
from bertblocks.core.factories import CONTRACTS
from bertblocks.core.interfaces import ModelDims, PositionScheme
from bertblocks.families.family import FAMILY_CONTRACT
from bertblocks.plugins.attention import AttentionOptions, build_bert_attention
from bertblocks.registry import BuildError, Registry
from bertblocks.registry.manager import builtin_contracts
from tests.conftest import TINY
from tests.test_plugin_docs import RECORDED

REGISTRY_PACKAGE = Path(bertblocks.registry.__file__).parent


@pytest.mark.parametrize("kind", KINDS)
def test_each_kinds_protocol_names_exactly_the_arguments_of_its_row_and_the_builder_passes(kind):
    row = builtin_contracts()[kind]
    parameters = inspect.signature(row.protocol.__call__).parameters
    assert {name for name in parameters if name != "self"} == row.arguments == RECORDED[kind]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in parameters.items() if name != "self")
    assert set(row.subcomponents) <= row.arguments
    assert set(row.subcomponents.values()) <= set(KINDS)


def test_every_kind_has_one_contract_row():
    assert set(builtin_contracts()) == set(KINDS)
    assert {*CONTRACTS, FAMILY_CONTRACT.kind} == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_the_registry_answers_the_real_interface_of_every_built_in_kind(kind):
    contract = Registry(load_entry_points=False).contract(kind)
    assert contract is builtin_contracts()[kind]
    assert contract.returns is not object
    assert contract.returns is inspect.signature(contract.protocol.__call__, eval_str=True).return_annotation


def test_a_plugin_kind_has_the_contract_its_declaration_gives():
    class Gate(nn.Module):
        pass

    registry = Registry(load_entry_points=False)
    registry.register(
        SimpleNamespace(bertblocks_register_kinds=lambda: [ComponentKind("gate", returns=Gate)]), name="gates"
    )
    contract = registry.contract("gate")
    assert (contract.kind, contract.returns, contract.arguments) == ("gate", Gate, None)
    assert set(registry.kinds()) == {*KINDS, "gate"}
    assert all(registry.contract(kind) for kind in registry.kinds())  # every kind the registry lists has one


def test_the_registry_package_never_probes_a_signature():
    """The contract table says what a factory receives: no module of bertblocks/registry/ imports inspect or
    calls ``signature(...)`` (nor ``getfullargspec``, ``__code__``) to find out."""
    offenders = []
    for path in sorted(REGISTRY_PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "inspect" for a in node.names):
                offenders.append(f"{path.name}:{node.lineno} imports inspect")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "inspect":
                offenders.append(f"{path.name}:{node.lineno} imports from inspect")
            elif isinstance(node, ast.Attribute) and node.attr in {"signature", "getfullargspec", "__code__"}:
                offenders.append(f"{path.name}:{node.lineno} reads .{node.attr}")
            elif isinstance(node, ast.Name) and node.id in {"signature", "getfullargspec"}:
                offenders.append(f"{path.name}:{node.lineno} names {node.id}")
    assert offenders == []


# ------------------------------------------------------------------- sub-components of built-in kinds, checked
class NormedAttentionOptions(AttentionOptions):
    """BERT's attention options, plus a built-in ``norm`` the attention builds itself."""

    model_config = ConfigDict(extra="forbid")

    extra_norm: ComponentSpec = subcomponent("norm", "layernorm", "a norm of the attention output")


class NotANorm:
    """What a buggy norm plugin returns: not a module."""


class NormPlugin:
    """An attention that builds a ``norm`` sub-component through the registry, and a norm that is no module."""

    def __init__(self, **build_kwargs: Any) -> None:
        self.build_kwargs = build_kwargs

    def bertblocks_register_components(self) -> list[Component]:
        def build_attention(*, build: Any, options: NormedAttentionOptions, **kwargs: Any) -> Any:
            attention = build_bert_attention(options=options, **kwargs)
            attention.extra_norm = build("norm", options.extra_norm, **self.build_kwargs)
            return attention

        return [
            Component("attention", "normed", build_attention, NormedAttentionOptions),
            Component("norm", "not_a_norm", lambda *, hidden_size, eps, options: NotANorm()),
        ]


def _normed_config(norm: str) -> dict[str, Any]:
    config = copy.deepcopy(TINY)
    config["encoder"]["attention"].update(name="normed", extra_norm={"name": norm})
    return config


def _registry(plugin: Any) -> Registry:
    registry = Registry(load_entry_points=False)
    registry.register(plugin, name="normed-plugin")
    return registry


def test_a_built_in_kind_sub_component_is_built_and_checked():
    model = create_model(_normed_config("layernorm"), registry=_registry(NormPlugin(hidden_size=32, eps=1e-12)))
    assert isinstance(model.encoder.layer[0].attention.extra_norm, nn.LayerNorm)


def test_a_sub_component_of_a_built_in_kind_returning_the_wrong_type_is_a_clear_build_error():
    with pytest.raises(BuildError) as info:
        create_model(_normed_config("not_a_norm"), registry=_registry(NormPlugin(hidden_size=32, eps=1e-12)))
    assert str(info.value) == (
        "encoder layer 0 attention norm 'not_a_norm': norm 'not_a_norm' from normed-plugin returned NotANorm, "
        "not a Module as the norm contract requires (config: encoder.attention.extra_norm)"
    )


def test_a_sub_component_built_with_other_arguments_than_its_kinds_contract_is_a_clear_build_error():
    with pytest.raises(BuildError) as info:
        create_model(_normed_config("layernorm"), registry=_registry(NormPlugin(hidden_size=32)))
    assert "norm 'layernorm' from bertblocks.plugins.norms (bertblocks) would be called with hidden_size, options;" in (
        str(info.value)
    )
    assert "(missing: eps)" in str(info.value)
    assert "(config: encoder.attention.extra_norm)" in str(info.value)


def test_a_factory_gets_build_only_when_its_options_declare_sub_components():
    seen: list[set[str]] = []

    def build_pooler(**kwargs: Any) -> Any:
        seen.append(set(kwargs))
        return Registry(load_entry_points=False).get("pooler", "first_token").factory(**kwargs)

    registry = _registry(
        SimpleNamespace(bertblocks_register_components=lambda: [Component("pooler", "spy", build_pooler)])
    )
    config = copy.deepcopy(TINY)
    config["pooler"] = {"name": "spy"}
    create_model(config, registry=registry)
    assert seen  # measured on the meta device, then built: no `build` either time (NoOptions names no sub-component)
    assert all(kwargs == {"hidden_size", "options"} for kwargs in seen)


def test_a_head_refusing_the_config_goes_through_the_builders_error():
    config = copy.deepcopy(TINY)
    config.update(head="question_answering", num_labels=3)
    with pytest.raises(BuildError) as info:
        create_model(config)
    message = str(info.value)
    assert message.startswith("head: head 'question_answering' from bertblocks.plugins.heads")
    assert "failed to build" in message
    assert message.endswith("(config: head)")


def test_heads_without_options_share_no_options():
    heads = Registry(load_entry_points=False).components("head")
    assert heads
    # heads with real options (the family heads: an activation, an embedding width) have their own models
    assert {h.options for h in heads if not h.options.model_fields} == {NoOptions}


@pytest.mark.parametrize(
    ("name", "declared"), [("absolute", False), ("relative_key", True), ("relative_key_query", True)]
)
def test_builtin_position_schemes_declare_what_they_contribute(name, declared):
    component = Registry(load_entry_points=False).get("position", name)
    dims = ModelDims(
        hidden_size=8, num_heads=2, num_layers=1, layer_norm_eps=1e-12, hidden_dropout=0.0, max_positions=16
    )
    scheme = component.factory(max_positions=16, model=dims, options=component.options())
    assert scheme.adds_score_bias is declared
    assert (scheme.attention_bias(2, 4) is not None) is declared


def test_the_builder_reads_the_declaration_without_building_a_bias():
    from bertblocks.core.component import Component
    from bertblocks.core.interfaces import AttentionBackend, BackendCapabilities

    built = []

    class Declared(PositionScheme):
        name = "declared"
        adds_score_bias = True

        def attention_bias(self, num_heads, head_dim):
            built.append((num_heads, head_dim))
            return object()  # stands in for a bias: only whether there is one matters here

    class NoMask(AttentionBackend):
        name = "nomask"
        capabilities = BackendCapabilities(additive_mask=False)

        def __call__(self, *args, **kwargs):  # never run: the build fails first
            raise AssertionError

    registry = Registry(load_entry_points=False)
    registry.register(
        type(
            "P",
            (),
            {
                "bertblocks_register_components": staticmethod(
                    lambda: [
                        Component(
                            "position", "declared", lambda max_positions, model, options: Declared(max_positions)
                        ),
                        Component("backend", "nomask", lambda options: NoMask()),
                    ]
                )
            },
        )(),
        "declaring-plugin",
    )
    config = {"vocab_size": 99, "hidden_size": 32, "position": "declared"}
    config["encoder"] = {"num_layers": 1, "attention": {"num_heads": 4, "backend": "nomask"}}
    with pytest.raises(BuildError, match="cannot take an additive score bias"):
        create_model(config, registry=registry)
    assert built == []  # the declaration decided; no bias was built to find out


def test_a_family_is_built_through_the_builders_mechanism():
    from bertblocks.hf.families import get_family

    registry = _registry(
        SimpleNamespace(bertblocks_register_components=lambda: [Component("family", "broken", lambda *, options: {})])
    )
    assert get_family("bert", registry).model_type == "bert"
    with pytest.raises(BuildError) as info:
        get_family("broken", registry)
    assert str(info.value) == (
        "family 'broken': family 'broken' from normed-plugin returned dict, not a Family as the family contract "
        "requires (config: model_type)"
    )
