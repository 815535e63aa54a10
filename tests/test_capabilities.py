"""Capabilities as declarations (bertblocks/core/capabilities.py): a ``reads_padded_positions`` declaration made by
any component kind turns automatic packing off, naming the component; one mechanism finds every declaration."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest
import torch

import bertblocks
from bertblocks.core.capabilities import AttentionCapabilities, CapabilityError, auto_packing_limit, padding_readers
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


def _norm_reading_above(above: Any) -> Registry:
    """The built-ins plus the norm ``reading``: LayerNorm declaring ``reads_padded_positions_above = above``."""
    component = Registry(load_entry_points=False).get("norm", "layernorm")

    def make(**kwargs: Any) -> Any:
        built = component.factory(**kwargs)
        built.reads_padded_positions_above = above
        return built

    variant = dataclasses.replace(component, name="reading", provider="", factory=make, aliases=())
    registry = Registry(load_entry_points=False)
    registry.register(types.SimpleNamespace(bertblocks_register_components=lambda: [variant]), name="reading")
    return registry


def test_a_length_dependent_declaration_packs_up_to_its_length_only():
    """``reads_padded_positions_above = 8``: `auto` packs a batch padded to 8 tokens and leaves one of 9 padded; the
    reason says from which length, every reader is named with its threshold."""
    model = bertblocks.create_model(
        _merged(TINY_CONFIG, {"encoder": {"norm": "reading"}}), registry=_norm_reading_above(8)
    )
    model.eval()
    assert model.auto_packing_limit == 8
    assert (model.auto_packs(8), model.auto_packs(9)) == (True, False)
    assert "encoder.layer.0.attention.output.LayerNorm (LayerNorm, above 8 tokens)" in map(str, model.padding_readers)
    assert model.packing_off_reason.startswith("encoder.packing: auto does not pack batches longer than 8 tokens")
    assert "reads_padded_positions_above" in model.packing_off_reason
    for length, packs in ((8, True), (9, False)):
        batch = padded_batch(length=length)
        with torch.no_grad():
            out = model(**batch).last_hidden_state
        at_padding = out[batch["attention_mask"] == 0].abs()
        assert (at_padding.max() == 0) if packs else (at_padding.min() > 0), length  # packed: zeros there


def test_the_lowest_declaration_decides_and_reads_padded_positions_means_every_length():
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    module[0].reads_padded_positions_above = 700
    module[1].reads_padded_positions_above = 14
    assert [str(reader) for reader in padding_readers(module)] == [
        "0 (Linear, above 700 tokens)",
        "1 (Linear, above 14 tokens)",
    ]
    assert auto_packing_limit(padding_readers(module)) == 14
    module[2].reads_padded_positions = True  # the same as reads_padded_positions_above = 0
    assert auto_packing_limit(padding_readers(module)) == 0
    assert auto_packing_limit([]) is None


def test_a_head_reading_padding_keeps_a_length_dependent_backbone_from_packing_any_batch():
    """BigBird's attention (from 7 tokens with blocks of 1) under question answering's head (every batch): the
    task model's backbone counts both, the lower threshold wins."""
    config = _merged(
        TINY_CONFIG, {"encoder": {"attention": {"name": "block_sparse", "block_size": 1, "num_random_blocks": 1}}}
    )
    backbone = bertblocks.create_model(config)
    assert backbone.auto_packing_limit == 7
    qa = bertblocks.create_model(config, head="question_answering")
    assert qa.bert.auto_packing_limit == 0
    assert not qa.bert.auto_packs(1)
    reason = qa.bert.packing_off_reason
    assert reason.startswith("encoder.packing: auto does not pack: ")
    assert "encoder.layer.0.attention (BlockSparseAttention, above 7 tokens)" in reason
    assert "head (" in reason


@pytest.mark.parametrize("value", [-1, "8", 8.0, True])
def test_a_malformed_length_declaration_is_refused_naming_the_component(value):
    with pytest.raises(CapabilityError, match=r"LayerNorm at encoder\.layer\.0\.attention\.output\.LayerNorm declar"):
        bertblocks.create_model(
            _merged(TINY_CONFIG, {"encoder": {"norm": "reading"}}), registry=_norm_reading_above(value)
        )
