"""The key map's ``Join`` rule: several checkpoint tensors ↔ one fused model tensor (the converse of ``Split``),
on state dicts alone."""

from __future__ import annotations

import pytest
import torch

from bertblocks.families.keymap import Join, KeyMap, KeyMapError, Rename, to_checkpoint, to_model

QKV = Join(tuple(f"m.layers.{{i}}.{p}_proj" for p in "qkv"), "bert.l.{i}.Wqkv")
KEY_MAP = KeyMap(prefix="m", rules=(QKV,))


def parts(layer: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(layer)
    return {
        f"m.layers.{layer}.{p}_proj.{kind}": torch.randn(4, 3, generator=g)
        if kind == "weight"
        else torch.randn(4, generator=g)
        for p in "qkv"
        for kind in ("weight", "bias")
    }


def test_parts_are_concatenated_in_order_on_load_and_cut_back_on_save():
    state = {**parts(0), **parts(1)}
    model = to_model(state, KEY_MAP)
    assert sorted(model) == ["bert.l.0.Wqkv.bias", "bert.l.0.Wqkv.weight", "bert.l.1.Wqkv.bias", "bert.l.1.Wqkv.weight"]
    expected = torch.cat([state[f"m.layers.1.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(model["bert.l.1.Wqkv.weight"], expected)
    back = to_checkpoint(model, KEY_MAP)
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_a_missing_part_is_an_error_naming_it():
    state = parts(0)
    del state["m.layers.0.k_proj.weight"]
    with pytest.raises(KeyMapError, match=r"m\.layers\.0\.k_proj\.weight"):
        to_model(state, KEY_MAP)


def test_a_fused_tensor_the_parts_cannot_share_equally_is_an_error():
    with pytest.raises(KeyMapError, match="cannot be cut into 3 equal parts"):
        to_checkpoint({"bert.l.0.Wqkv.weight": torch.zeros(7, 3)}, KEY_MAP)


def test_an_earlier_rule_wins_on_save_so_a_join_can_be_a_load_only_alias():
    key_map = KeyMap(prefix="m", rules=(Rename("m.layers.{i}.Wqkv", "bert.l.{i}.Wqkv"), QKV))
    loaded = to_model(parts(0), key_map)  # the other format's parts still load
    assert torch.equal(loaded["bert.l.0.Wqkv.bias"], torch.cat([parts(0)[f"m.layers.0.{p}_proj.bias"] for p in "qkv"]))
    assert sorted(to_checkpoint(loaded, key_map)) == ["m.layers.0.Wqkv.bias", "m.layers.0.Wqkv.weight"]


def test_parts_are_keys_the_family_knows():
    key_map = KeyMap(prefix="model", rules=(Join(("x.q", "x.k"), "bert.qk"),))
    assert key_map.knows("x.k.weight")
    assert not key_map.knows("x.kv.weight")


def test_parts_of_two_formats_joining_into_one_tensor_are_an_error():
    other = Join(("m.layers.{i}.qkv_a", "m.layers.{i}.qkv_b"), "bert.l.{i}.Wqkv")
    key_map = KeyMap(prefix="m", rules=(QKV, other))
    state = {"m.layers.0.q_proj.weight": torch.zeros(4, 3), "m.layers.0.qkv_b.weight": torch.zeros(4, 3)}
    with pytest.raises(KeyMapError, match="mixing two formats"):
        to_model(state, key_map)
