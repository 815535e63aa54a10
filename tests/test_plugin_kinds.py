"""What plugins can do beyond filling the built-in kinds: declare kinds of their own, check the whole config at
``validate``, take options named like typed config fields; and the rough edges an author meets (a misspelt
hook in an in-process plugin, a backend returning a transposed output)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from bertblocks import create_model, load_config
from bertblocks.config import ComponentSpec, ConfigError
from bertblocks.core.component import Component, ComponentKind, subcomponent
from bertblocks.core.interfaces import AttentionBackend, BackendCapabilities, FeedForward
from bertblocks.plugins.attention import AttentionOptions, build_bert_attention
from bertblocks.plugins.feedforward import BertIntermediate, BertOutput
from bertblocks.registry import BuildError, KindCollisionError, PluginLoadError, Registry
from tests.conftest import TINY


# ------------------------------------------------------------------------------------ a plugin-declared kind
class Gate(nn.Module):
    """Scales the attention output: the sub-component a gated attention builds through the registry."""

    def __init__(self, hidden_size: int, scale: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((hidden_size,), scale))


class ConstantGateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scale: float = Field(1.0, gt=0, description="initial gate value")


class GatedAttentionOptions(AttentionOptions):  # BERT's attention options, plus a gate
    model_config = ConfigDict(extra="forbid")

    gate: ComponentSpec = subcomponent("gate", "constant", "how the output is gated")


class GatedPlugin:
    """Declares kind ``gate`` with one component, and an attention whose options name a gate."""

    @staticmethod
    def bertblocks_register_kinds() -> list[ComponentKind]:
        return [ComponentKind("gate", returns=Gate, description="scales an attention output")]

    @staticmethod
    def bertblocks_register_components() -> list[Component]:
        def build_gate(*, hidden_size: int, options: ConstantGateOptions) -> Gate:
            return Gate(hidden_size, options.scale)

        def build_attention(*, build: Any, options: GatedAttentionOptions, **kwargs: Any) -> Any:
            attention = build_bert_attention(options=options, **kwargs)
            attention.gate = build("gate", options.gate, hidden_size=kwargs["hidden_size"])
            return attention

        return [
            Component("gate", "constant", build_gate, ConstantGateOptions),
            Component("attention", "gated", build_attention, GatedAttentionOptions),
        ]


def _registry(*plugins: Any) -> Registry:
    registry = Registry(load_entry_points=False)
    for i, plugin in enumerate(plugins):
        registry.register(plugin, name=f"plugin{i}")
    return registry


def _config(**attention: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(TINY)
    cfg["encoder"]["attention"].update(attention)
    return cfg


def test_a_plugin_kind_is_built_through_the_registry():
    registry = _registry(GatedPlugin())
    assert "gate" in registry.kinds()
    model = create_model(_config(name="gated", gate={"name": "constant", "scale": 0.5}), registry=registry)
    gate = model.encoder.layer[0].attention.gate
    assert isinstance(gate, Gate)
    assert torch.equal(gate.weight, torch.full((32,), 0.5))
    # the default sub-component, filled in by validation
    config = load_config(_config(name="gated"), registry=registry)
    assert config.encoder.attention.options()["gate"] == {"name": "constant", "scale": 1.0}


def test_a_plugin_kind_is_validated_with_dotted_paths():
    registry = _registry(GatedPlugin())
    with pytest.raises(ConfigError) as info:
        load_config(_config(name="gated", gate={"name": "constant", "scael": 2.0}), registry=registry)
    assert "encoder.attention.gate.scael: unknown field" in str(info.value)
    assert "did you mean 'scale'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(_config(name="gated", gate={"name": "constnat"}), registry=registry)
    assert "encoder.attention.gate: unknown gate 'constnat'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(_config(name="gated", gate={"name": "constant", "scale": -1}), registry=registry)
    assert "encoder.attention.gate.scale" in str(info.value)


def test_a_plugin_kind_colliding_with_a_built_in_kind_is_an_error_at_validate():
    class Colliding:
        @staticmethod
        def bertblocks_register_kinds() -> list[ComponentKind]:
            return [ComponentKind("attention")]

    registry = _registry(Colliding())
    with pytest.raises(KindCollisionError, match=r"kind 'attention' is declared twice: by bertblocks \(built in\)"):
        load_config(copy.deepcopy(TINY), registry=registry)


def test_two_plugins_declaring_one_kind_is_an_error_naming_both():
    registry = _registry(GatedPlugin(), SimpleNamespace(bertblocks_register_kinds=lambda: [ComponentKind("gate")]))
    with pytest.raises(KindCollisionError, match="declared twice: by plugin0 and by plugin1"):
        registry.components()


def test_a_component_of_an_undeclared_kind_is_a_load_error():
    plugin = SimpleNamespace(bertblocks_register_components=lambda: [Component("gate", "x", lambda **_: None)])
    registry = _registry(plugin)
    registry.components()
    assert any("unknown kind 'gate'" in e.detail for e in registry.load_errors)


# ------------------------------------------------------------------------------------ whole-config checks
def test_a_component_validates_the_whole_config_at_validate():
    def needs_eager(config: Any, spec: ComponentSpec, loc: str) -> list[str]:
        return [] if config.encoder.attention.backend.name == "eager" else ["needs backend eager"]

    plugin = SimpleNamespace(
        bertblocks_register_components=lambda: [
            Component("attention", "picky", build_bert_attention, validate=needs_eager)
        ]
    )
    registry = _registry(plugin)
    with pytest.raises(ConfigError, match=r"encoder\.attention: needs backend eager"):
        load_config(_config(name="picky"), registry=registry)
    load_config(_config(name="picky", backend="eager"), registry=registry)
    # used only through an override: checked there, with the override's path
    cfg = copy.deepcopy(TINY)
    cfg["encoder"]["overrides"] = [{"layers": 1, "attention": {"name": "picky"}}]
    with pytest.raises(ConfigError, match=r"encoder.overrides.0.attention: needs backend eager"):
        load_config(cfg, registry=registry)


# ------------------------------------------------------------- plugin options named like typed fields
class WideOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    intermediate_size: int = Field(8, description="the plugin's own default, which must not win")


def test_a_plugin_option_named_like_a_typed_field_gets_the_configs_value():
    seen: dict[str, int] = {}

    def build(*, hidden_size: int, intermediate_size: int, activation: Any, dropout: float, layer_norm_eps: float,
              options: WideOptions, norm: Any = None) -> FeedForward:  # fmt: skip
        seen["option"] = options.intermediate_size
        return FeedForward(
            BertIntermediate(hidden_size, options.intermediate_size, activation()),
            BertOutput(options.intermediate_size, hidden_size, layer_norm_eps, dropout, norm() if norm else None),
        )

    plugin = SimpleNamespace(
        bertblocks_register_components=lambda: [Component("feedforward", "wide", build, WideOptions)]
    )
    registry = _registry(plugin)
    cfg = copy.deepcopy(TINY)
    cfg["encoder"]["feedforward"] = {"name": "wide", "intermediate_size": 21}
    model = create_model(cfg, registry=registry)
    assert seen["option"] == 21
    assert model.encoder.layer[0].intermediate.dense.out_features == 21


# ------------------------------------------------------------------------------------ plugin-author edges
def test_a_misspelt_hook_in_an_in_process_plugin_is_reported():
    plugin = SimpleNamespace(bertblocks_register_component=lambda: [])
    registry = Registry(load_entry_points=False)
    registry.register(plugin, name="typo")
    (error,) = registry.load_errors
    assert "bertblocks_register_component is not a bertblocks hook" in error.detail
    assert "did you mean 'bertblocks_register_components'" in error.detail
    with pytest.raises(PluginLoadError):
        Registry(load_entry_points=False, strict=True).register(plugin, name="typo")


class TransposingBackend(AttentionBackend):
    """Returns ``[b, q, h, d]``: the mistake the build-time probe must catch."""

    name = "transposing"
    capabilities = BackendCapabilities()

    def __call__(self, query, key, value, *, mask, scale, dropout_p, is_causal, need_weights):
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        return out.transpose(1, 2), None


def test_a_backend_with_a_transposed_output_fails_at_build_naming_it():
    plugin = SimpleNamespace(
        bertblocks_register_components=lambda: [
            Component("backend", "transposing", lambda *, options: TransposingBackend())
        ]
    )
    registry = _registry(plugin)
    with pytest.raises(BuildError, match=r"backend 'transposing' from plugin0 returned \(1, 5, 4, 8\).*transposed"):
        create_model(_config(backend="transposing"), registry=registry)


def test_an_attention_without_the_documented_arguments_fails_at_build_naming_it():
    def legacy(*, hidden_size, num_heads, dropout, hidden_dropout, layer_norm_eps, backend, position, options):  # type: ignore[no-untyped-def]
        return build_bert_attention(
            hidden_size=hidden_size, num_heads=num_heads, dropout=dropout, hidden_dropout=hidden_dropout,
            layer_norm_eps=layer_norm_eps, backend=backend, position=position, options=options,
        )  # fmt: skip

    plugin = SimpleNamespace(bertblocks_register_components=lambda: [Component("attention", "legacy", legacy)])
    registry = _registry(plugin)
    # every factory gets the whole documented contract (`norm`, `layer_index`): no signature probing
    with pytest.raises(BuildError, match=r"attention 'legacy' from plugin0 failed to build: TypeError.*unexpected"):
        create_model(_config(name="legacy"), registry=registry)


def test_components_lists_a_plugin_kind(capsys):
    import bertblocks.registry as registry_module
    from bertblocks import cli

    registry_module.set_registry(_registry(GatedPlugin()))
    assert cli.main(["components", "gate", "-v"]) == 0
    out = capsys.readouterr().out
    assert "gate  constant" in out
    assert "gate constant: scale (float > 0, default 1.0): initial gate value" in out


def test_aliases_resolve_and_collide_like_names():
    registry = Registry(load_entry_points=False)
    assert registry.get("activation", "swiglu").name == "silu"
    assert "swiglu" not in {c.name for c in registry.components("activation")}
    from bertblocks.registry import DuplicateComponentError

    clash = SimpleNamespace(
        bertblocks_register_components=lambda: [
            Component("activation", "my_gate", lambda *, options: nn.SiLU(), aliases=("swiglu",))
        ]
    )
    registry = _registry(clash)
    assert registry.get("activation", "silu").name == "silu"  # the clash does not take others down
    with pytest.raises(DuplicateComponentError, match="activation 'swiglu' is registered twice"):
        registry.get("activation", "swiglu")
