"""A model whose layers have different head counts (``encoder.overrides[].attention.num_heads``): the head mask and
the decoder cache are checked against each layer's own heads and head width, not the model-wide ones."""

from __future__ import annotations

import pytest
import torch

import bertblocks

HIDDEN = 32


def _config(is_decoder: bool = False) -> dict:
    return {
        "vocab_size": 50,
        "hidden_size": HIDDEN,
        "max_position_embeddings": 32,
        "is_decoder": is_decoder,
        "encoder": {
            "num_layers": 3,
            "attention": {"num_heads": 4, "backend": "eager"},
            "feedforward": {"intermediate_size": 48},
            "overrides": [{"layers": 1, "attention": {"num_heads": 8}}],
        },
    }


def _model(is_decoder: bool = False) -> bertblocks.BertModel:
    torch.manual_seed(0)
    return bertblocks.create_model(_config(is_decoder)).eval()


def test_the_layers_have_the_heads_their_overrides_give():
    model = _model()
    assert [model.encoder.layer_at(i).attention.num_heads for i in range(3)] == [4, 8, 4]
    assert [model.encoder.layer_at(i).attention.head_dim for i in range(3)] == [8, 4, 8]


def test_a_per_layer_head_mask_scales_each_layers_own_heads():
    model = _model()
    ids = torch.randint(0, 50, (2, 7))
    ones = [torch.ones(4), torch.ones(8), torch.ones(4)]
    plain = model(ids).last_hidden_state
    assert torch.equal(model(ids, head_mask=ones).last_hidden_state, plain)  # all ones: nothing changes
    # masking head 5 of layer 1 (a head the model-wide count of 4 does not have) changes the output, and equals
    # the model with that head's slice of the output projection zeroed
    masked = [torch.ones(4), torch.ones(8), torch.ones(4)]
    masked[1][5] = 0.0
    out = model(ids, head_mask=masked).last_hidden_state
    assert not torch.allclose(out, plain)
    attention = model.encoder.layer_at(1).attention
    dense = attention.output.dense
    d = attention.head_dim
    with torch.no_grad():
        dense.weight[:, 5 * d : 6 * d] = 0.0
    torch.testing.assert_close(out, model(ids).last_hidden_state, atol=1e-5, rtol=0)


def test_a_head_mask_of_the_wrong_shape_names_each_layers_heads():
    model = _model()
    ids = torch.randint(0, 50, (1, 5))
    with pytest.raises(ValueError, match=r"layer 1 has 8 heads"):
        model(ids, head_mask=torch.ones(4))  # one mask for every layer cannot fit layers of 4 and 8 heads
    with pytest.raises(ValueError, match=r"layer 1 has 8 heads"):
        model(ids, head_mask=[torch.ones(4), torch.ones(4), torch.ones(4)])


def test_a_legacy_cache_of_a_model_with_per_layer_heads_is_accepted():
    model = _model(is_decoder=True)
    ids = torch.randint(0, 50, (1, 6))
    full = model(ids).last_hidden_state
    first = model(ids[:, :4], use_cache=True)
    legacy = first.past_key_values.to_legacy()
    assert [k.shape[1:] for k, _ in legacy] == [(4, 4, 8), (8, 4, 4), (4, 4, 8)]  # [heads, length, head_dim]
    step = model(ids[:, 4:], past_key_values=legacy, use_cache=True).last_hidden_state
    torch.testing.assert_close(step, full[:, 4:], atol=1e-5, rtol=0)


def test_a_cache_from_a_model_with_other_head_widths_is_refused_naming_the_layer():
    model = _model(is_decoder=True)
    ids = torch.randint(0, 50, (1, 4))
    legacy = list(model(ids, use_cache=True).past_key_values.to_legacy())
    k, v = legacy[1]
    legacy[1] = (k.reshape(1, 4, 4, 8), v.reshape(1, 4, 4, 8))  # 4 heads x 8 dims: the model-wide shape
    with pytest.raises(ValueError, match=r"layer 1 holds 4 heads x 8 dims but this model's layer 1 has 8 x 4"):
        model(ids[:, :1], past_key_values=legacy)
