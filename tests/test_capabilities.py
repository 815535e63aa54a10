"""Capabilities as declarations (bertblocks/core/capabilities.py): a ``reads_padded_positions`` declaration made by
any component kind turns automatic packing off, naming the component; one mechanism finds every declaration."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest
import torch

import bertblocks
from bertblocks.core.capabilities import AttentionCapabilities, CapabilityError, padding_readers
from bertblocks.registry import BuildError, Registry
from bertblocks.testing import TINY_CONFIG
from bertblocks.testing.inputs import padded_batch

#: per kind: the config place a variant named ``declaring`` takes, and the name the declaration is reported under
PLACES: dict[str, tuple[dict[str, Any], str]] = {
    "embedding": ({"embedding": "declaring"}, "embeddings (BertEmbeddings)"),
    "position": ({"position": "declaring"}, "position (AbsolutePositions)"),
    "backend": ({"encoder": {"attention": {"backend": "declaring"}}}, "encoder.layer.0.attention.backend (Sdpa"),
    "attention": ({"encoder": {"attention": {"name": "declaring"}}}, "encoder.layer.0.attention (BertAttention)"),
    "feedforward": ({"encoder": {"feedforward": {"name": "declaring"}}}, "encoder.layer.0.output (BertOutput)"),
    "norm": ({"encoder": {"norm": "declaring"}}, "encoder.layer.0.attention.output.LayerNorm (LayerNorm)"),
    "layer": ({"encoder": {"layer": "declaring"}}, "encoder.layer.0 (TransformerLayer)"),
    "pooler": ({"pooler": "declaring"}, "pooler (FirstTokenPooler)"),
}
BUILTIN = {
    "embedding": "bert",
    "position": "absolute",
    "backend": "sdpa",
    "attention": "bert",
    "feedforward": "bert",
    "norm": "layernorm",
    "layer": "post_ln",
    "pooler": "first_token",
}


def _declaring(kind: str) -> Registry:
    """The built-ins plus ``(kind, "declaring")``: the built-in component whose built object declares
    ``reads_padded_positions`` (a feed-forward on its output half, where a convolution would sit)."""
    builtins = Registry(load_entry_points=False)
    component = builtins.get(kind, BUILTIN[kind])

    def make(**kwargs: Any) -> Any:
        built = component.factory(**kwargs)
        (built.output if kind == "feedforward" else built).reads_padded_positions = True
        return built

    variant = dataclasses.replace(component, name="declaring", provider="", factory=make, aliases=())
    registry = Registry(load_entry_points=False)
    registry.register(types.SimpleNamespace(bertblocks_register_components=lambda: [variant]), name="declaring")
    return registry


def _merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in change.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("kind", sorted(PLACES))
def test_any_kind_declaring_it_turns_auto_packing_off_and_is_named(kind):
    place, reported = PLACES[kind]
    config = _merged(TINY_CONFIG, place)
    model = bertblocks.create_model(config, registry=_declaring(kind)).eval()
    assert model.config.encoder.packing == "auto"
    assert any(str(reader).startswith(reported) for reader in model.padding_readers), model.padding_readers
    assert reported in model.packing_off_reason
    batch = padded_batch()
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    # a packed pass leaves exact zeros at padded positions; this one computed them: it did not pack
    assert out[batch["attention_mask"] == 0].abs().min() > 0


def test_an_undeclared_model_packs_automatically():
    model = bertblocks.create_model(TINY_CONFIG).eval()
    assert model.padding_readers == ()
    assert model.packing_off_reason is None
    batch = padded_batch()
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    assert out[batch["attention_mask"] == 0].abs().max() == 0  # packed: zeros at padded positions


def test_only_a_true_declaration_counts():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    module[0].reads_padded_positions = "yes"  # not the declaration (exactly True)
    module[1].reads_padded_positions = True
    assert [str(reader) for reader in padding_readers(module)] == ["1 (Linear)"]


def test_attention_capabilities_say_why_in_errors():
    declared = AttentionCapabilities(pruning=False, reason="a reason")
    assert declared.refusal("cannot prune") == "cannot prune (a reason)"
    assert AttentionCapabilities().refusal("cannot prune") == "cannot prune"


def test_grouped_query_attention_declares_it_cannot_be_pruned():
    overrides = ["encoder.attention.num_kv_heads=2"]
    model = bertblocks.create_model(TINY_CONFIG, overrides)
    with pytest.raises(CapabilityError, match="grouped-query attention: each key/value head serves several"):
        model.prune_heads({0: [1]})
    with pytest.raises(BuildError, match=r"pruned_heads\.0: encoder layer 0: attention 'bert'.*grouped-query"):
        bertblocks.create_model(TINY_CONFIG, [*overrides, "pruned_heads={0: [1]}"])
