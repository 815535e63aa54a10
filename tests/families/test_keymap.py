"""The key-map engine on plain state dicts: each rule both ways, round trips, and its errors."""

from __future__ import annotations

import pytest
import torch

from bertblocks.families.keymap import (
    AbsentBias,
    Drop,
    KeyMap,
    KeyMapError,
    Rename,
    Shared,
    Split,
    to_checkpoint,
    to_model,
)


def t(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_prefix_alone_maps_the_backbone_and_leaves_heads():
    key_map = KeyMap(prefix="roberta")
    state = {"roberta.encoder.layer.0.output.dense.weight": t(2, 2), "classifier.weight": t(3, 2)}
    model = to_model(state, key_map)
    assert set(model) == {"bert.encoder.layer.0.output.dense.weight", "classifier.weight"}
    assert to_checkpoint(model, key_map).keys() == state.keys()


def test_rename_with_layer_placeholder_matches_whole_segments_only():
    key_map = KeyMap(
        prefix="m",
        rules=(Rename("m.layer.{i}.q_lin", "bert.encoder.layer.{i}.attention.self.query"),),
    )
    state = {"m.layer.11.q_lin.weight": t(2, 2), "m.layer.1.q_lin_extra.weight": t(2, 2)}
    model = to_model(state, key_map)
    assert "bert.encoder.layer.11.attention.self.query.weight" in model
    # `q_lin` does not match `q_lin_extra`: that key only gets the prefix rule
    assert "bert.layer.1.q_lin_extra.weight" in model
    back = to_checkpoint(model, key_map)
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_first_matching_rule_wins_and_head_scoped_rules_apply_to_their_heads_only():
    rules = (
        Rename("pre_classifier", "classifier.dense", heads=("dense_classification",)),
        Rename("classifier", "classifier.out_proj", heads=("dense_classification",)),
    )
    key_map = KeyMap(prefix="d", rules=rules)
    state = {"pre_classifier.weight": t(2, 2), "classifier.weight": t(3, 2)}
    assert set(to_model(state, key_map, head="dense_classification")) == {
        "classifier.dense.weight",
        "classifier.out_proj.weight",
    }
    # a token classifier keeps `classifier` as it is
    assert set(to_model(state, key_map, head="token_classification")) == set(state)
    model = to_model(state, key_map, head="dense_classification")
    assert set(to_checkpoint(model, key_map, head="dense_classification")) == set(state)


def test_a_rename_if_model_has_applies_on_load_only_where_the_model_has_the_key():
    """One checkpoint key, two layouts (X-MOD's post-LN and pre-norm): the model's keys decide."""
    key_map = KeyMap(prefix="r", rules=(Rename("r.layer.{i}.out.LayerNorm", "bert.layer.{i}.norm", if_model_has=True),))
    state = {"r.layer.0.out.LayerNorm.weight": t(2)}
    pre = to_model(state, key_map, shapes={"bert.layer.0.norm.weight": (2,)})
    assert set(pre) == {"bert.layer.0.norm.weight"}
    post = to_model(state, key_map, shapes={"bert.layer.0.out.LayerNorm.weight": (2,)})
    assert set(post) == {"bert.layer.0.out.LayerNorm.weight"}  # the next rule (the prefix) decided
    assert set(to_model(state, key_map)) == set(post)  # no shapes: no model to ask, the rule stands aside
    assert set(to_checkpoint(pre, key_map)) == set(to_checkpoint(post, key_map)) == set(state)


def test_split_fused_tensor_by_model_shapes_and_join_on_save():
    key_map = KeyMap(
        prefix="model",
        rules=(Split("model.layers.{i}.attn.Wqkv", ("bert.l.{i}.q", "bert.l.{i}.k", "bert.l.{i}.v")),),
    )
    q, k, v = t(4, 3, seed=1), t(2, 3, seed=2), t(2, 3, seed=3)  # grouped sizes: parts need not be equal
    state = {"model.layers.0.attn.Wqkv.weight": torch.cat([q, k, v])}
    shapes = {"bert.l.0.q.weight": (4, 3), "bert.l.0.k.weight": (2, 3), "bert.l.0.v.weight": (2, 3)}
    model = to_model(state, key_map, shapes=shapes)
    assert torch.equal(model["bert.l.0.q.weight"], q)
    assert torch.equal(model["bert.l.0.k.weight"], k)
    assert torch.equal(model["bert.l.0.v.weight"], v)
    back = to_checkpoint(model, key_map)
    assert list(back) == ["model.layers.0.attn.Wqkv.weight"]
    assert torch.equal(back["model.layers.0.attn.Wqkv.weight"], state["model.layers.0.attn.Wqkv.weight"])


def test_split_without_shapes_splits_evenly():
    key_map = KeyMap(prefix="m", rules=(Split("m.Wi", ("bert.up", "bert.gate")),))
    model = to_model({"m.Wi.weight": t(6, 2)}, key_map)
    assert model["bert.up.weight"].shape == model["bert.gate.weight"].shape == (3, 2)


def test_fused_tensor_of_the_wrong_size_names_key_and_expected_shape():
    key_map = KeyMap(prefix="m", rules=(Split("m.layers.{i}.Wqkv", ("bert.{i}.q", "bert.{i}.k", "bert.{i}.v")),))
    shapes = {f"bert.0.{p}.weight": (4, 4) for p in "qkv"}
    with pytest.raises(KeyMapError) as info:
        to_model({"m.layers.0.Wqkv.weight": t(10, 4)}, key_map, shapes=shapes)
    message = str(info.value)
    assert "'m.layers.0.Wqkv.weight' has shape (10, 4)" in message
    assert "expects the fused shape (12, 4) (= 4 + 4 + 4 along dim 0" in message


def test_shared_tensor_fans_out_to_every_layer_and_is_written_once():
    key_map = KeyMap(prefix="albert", rules=(Shared("albert.group.0", "bert.encoder.layer.{i}"),))
    shapes = {f"bert.encoder.layer.{i}.dense.weight": (2, 2) for i in range(3)}
    weight = t(2, 2)
    model = to_model({"albert.group.0.dense.weight": weight}, key_map, shapes=shapes)
    assert set(model) == set(shapes)
    assert all(v is weight for v in model.values())
    back = to_checkpoint(model, key_map)
    assert list(back) == ["albert.group.0.dense.weight"]


def test_shared_copies_that_differ_cannot_be_saved():
    key_map = KeyMap(prefix="albert", rules=(Shared("albert.group.0", "bert.encoder.layer.{i}"),))
    state = {"bert.encoder.layer.0.w": t(2, seed=1), "bert.encoder.layer.1.w": t(2, seed=2)}
    with pytest.raises(KeyMapError, match=r"differs from the other layers' copy of 'albert\.group\.0\.w'"):
        to_checkpoint(state, key_map)


def test_shared_without_model_shapes_is_an_error():
    key_map = KeyMap(prefix="albert", rules=(Shared("albert.group.0", "bert.encoder.layer.{i}"),))
    with pytest.raises(KeyMapError, match="shared by layers"):
        to_model({"albert.group.0.w": t(2)}, key_map)


def test_drop_and_absent_bias():
    key_map = KeyMap(
        prefix="m",
        rules=(Drop("m.embeddings.position_ids"), AbsentBias("bert.layer.{i}.dense.bias")),
    )
    shapes = {"bert.layer.0.dense.weight": (2, 2), "bert.layer.0.dense.bias": (2,)}
    state = {"m.layer.0.dense.weight": t(2, 2), "m.embeddings.position_ids": torch.arange(4)}
    model = to_model(state, key_map, shapes=shapes)
    assert set(model) == set(shapes)
    assert torch.equal(model["bert.layer.0.dense.bias"], torch.zeros(2))
    assert set(to_checkpoint(model, key_map)) == {"m.layer.0.dense.weight"}
    model["bert.layer.0.dense.bias"] = torch.ones(2)
    with pytest.raises(KeyMapError, match="is not zero, but this checkpoint format stores no such tensor"):
        to_checkpoint(model, key_map)


def test_knows_backbone_heads_and_rule_keys():
    key_map = KeyMap(prefix="roberta", rules=(Rename("lm_head.dense", "cls.x"),), head_prefixes=("classifier.",))
    assert key_map.knows("roberta.encoder.layer.0.w")
    assert key_map.knows("classifier.weight")
    assert key_map.knows("lm_head.dense.bias")
    assert not key_map.knows("lm_head.other.bias")
    assert not key_map.knows("robertaX.w")
