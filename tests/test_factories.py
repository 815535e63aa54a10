"""Each component kind's factory contract is typed once (bertblocks.core.factories) and is exactly what the
builder passes; heads are built by the registry's builder; position schemes declare what they contribute."""

from __future__ import annotations

import inspect

import pytest

from bertblocks import create_model
from bertblocks.core.component import KINDS, NoOptions
from bertblocks.core.factories import FACTORIES
from bertblocks.core.interfaces import PositionScheme
from bertblocks.families.family import FAMILY_FACTORY
from bertblocks.registry import BuildError, Registry
from tests.test_plugin_docs import RECORDED


@pytest.mark.parametrize("kind", KINDS)
def test_each_kinds_protocol_names_exactly_the_arguments_the_builder_passes(kind):
    protocol, _ = {**FACTORIES, "family": FAMILY_FACTORY}[kind]
    parameters = inspect.signature(protocol.__call__).parameters
    assert {name for name in parameters if name != "self"} == RECORDED[kind]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in parameters.items() if name != "self")


def test_every_kind_has_a_protocol():
    assert {*FACTORIES, "family"} == set(KINDS)


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
    scheme = component.factory(max_positions=16, options=component.options())
    assert scheme.adds_score_bias is declared
    assert (scheme.attention_bias(2, 4) is not None) is declared


@pytest.mark.parametrize("declared", [True, None])
def test_the_builder_reads_the_declaration_without_building_a_bias(declared):
    from bertblocks.core.component import Component
    from bertblocks.core.interfaces import AttentionBackend, BackendCapabilities

    built = []

    class Declared(PositionScheme):
        name = "declared"
        adds_score_bias = declared

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
                        Component("position", "declared", lambda max_positions, options: Declared(max_positions)),
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
    if declared:
        assert built == []  # the declaration decided; no bias was built to find out
    else:
        assert built == [(4, 8)]  # undeclared (a plugin older than the declaration): probed once
