"""Bad forward inputs get a ValueError saying what was expected; outputs read by attribute, key and index."""

from __future__ import annotations

import re

import pytest
import torch

import bertblocks
from tests.conftest import TINY, batch


@pytest.fixture(scope="module")
def model() -> bertblocks.BertModel:
    torch.manual_seed(0)
    return bertblocks.create_model(TINY).eval()


@pytest.fixture(scope="module")
def relative() -> bertblocks.BertModel:
    torch.manual_seed(0)
    return bertblocks.create_model(TINY, ["position=relative_key"]).eval()


IDS = batch()["input_ids"]  # [3, 9]
LONG = torch.ones(1, 65, dtype=torch.long)  # max_position_embeddings is 64


def _raises(model: bertblocks.BertModel, message: str, **inputs: object) -> None:
    with pytest.raises(ValueError, match=re.escape(message)), torch.no_grad():
        model(**inputs)


# ------------------------------------------------------------------------------------------ input_ids
@pytest.mark.parametrize("bad", [-1, 99, 10_000])
def test_input_ids_outside_the_vocabulary(model, bad: int):
    ids = IDS.clone()
    ids[1, 4] = bad
    _raises(model, f"input_ids hold {bad}, outside the vocabulary [0, 99) of this model", input_ids=ids)


def test_float_input_ids(model):
    _raises(model, "input_ids must be an integer tensor; got torch.float32", input_ids=IDS.float())


def test_input_ids_of_the_wrong_rank(model):
    _raises(model, "input_ids must be [batch, seq]; got shape (9,)", input_ids=IDS[0])


def test_neither_or_both_of_input_ids_and_inputs_embeds(model):
    _raises(model, "give exactly one of input_ids and inputs_embeds")
    _raises(model, "give exactly one of input_ids and inputs_embeds", input_ids=IDS, inputs_embeds=torch.ones(3, 9, 32))


def test_inputs_embeds_of_the_wrong_width(model):
    _raises(model, "inputs_embeds must be [batch, seq, 32]; got (3, 9, 31)", inputs_embeds=torch.ones(3, 9, 31))


@pytest.mark.parametrize("which", ["absolute", "relative"])
def test_sequence_longer_than_max_position_embeddings(model, relative, which: str):
    chosen = model if which == "absolute" else relative
    message = "sequence length 65 exceeds max_position_embeddings=64 of this model"
    _raises(chosen, message, input_ids=LONG)
    _raises(chosen, message, inputs_embeds=torch.zeros(1, 65, 32))
    with torch.no_grad():  # the longest allowed sequence runs
        assert chosen(input_ids=LONG[:, :64]).last_hidden_state.shape == (1, 64, 32)


# -------------------------------------------------------------------------------------- attention_mask
def test_two_d_mask_of_the_wrong_length(model):
    _raises(
        model,
        "attention_mask has shape (3, 8) but the input needs (3, 9)",
        input_ids=IDS,
        attention_mask=torch.ones(3, 8, dtype=torch.long),
    )
    _raises(
        model,
        "attention_mask has shape (2, 9) but the input needs (3, 9)",
        input_ids=IDS,
        attention_mask=torch.ones(2, 9, dtype=torch.long),
    )


def test_three_d_mask_of_the_wrong_shape(model):
    _raises(
        model,
        "attention_mask has shape (3, 8, 9) but the input needs (3, 9, 9)",
        input_ids=IDS,
        attention_mask=torch.ones(3, 8, 9),
    )


def test_four_d_mask(model):
    _raises(
        model,
        "attention_mask must be 2-D [batch, key_len] or 3-D [batch, query_len, key_len]; got 4-D with shape "
        "(3, 1, 1, 9)",
        input_ids=IDS,
        attention_mask=torch.ones(3, 1, 1, 9),
    )


@pytest.mark.parametrize(
    "mask",
    [
        torch.zeros(3, 9) - 10000.0,  # an additive mask passed where a padding mask belongs
        torch.where(torch.arange(9) < 6, 0.0, torch.finfo(torch.float32).min).expand(3, 9),
        torch.full((3, 9), 2, dtype=torch.long),  # not 0/1 either: (1 - 2) * min is a huge positive bias
    ],
)
def test_additive_or_non_binary_mask(model, mask: torch.Tensor):
    _raises(model, "attention_mask holds values outside [0, 1]", input_ids=IDS, attention_mask=mask)


@pytest.mark.parametrize("dtype", [torch.bool, torch.long, torch.float32])
def test_zero_one_masks_of_every_dtype_agree(model, dtype: torch.dtype):
    mask = batch()["attention_mask"]
    with torch.no_grad():
        expected = model(input_ids=IDS, attention_mask=mask).last_hidden_state
        got = model(input_ids=IDS, attention_mask=mask.to(dtype)).last_hidden_state
    assert torch.equal(got, expected)  # every dtype becomes the same additive mask: same kernels, same data


# ------------------------------------------------------------------------------ token types, positions
def test_token_type_ids_out_of_range(model):
    types = torch.zeros(3, 9, dtype=torch.long)
    types[0, 0] = 2
    _raises(model, "token_type_ids must lie in [0, 2) (type_vocab_size)", input_ids=IDS, token_type_ids=types)
    _raises(model, "token_type_ids must lie in [0, 2)", input_ids=IDS, token_type_ids=types - 3)


def test_token_type_ids_of_the_wrong_shape_or_dtype(model):
    _raises(
        model,
        "token_type_ids must have the input's shape (3, 9); got (3, 8)",
        input_ids=IDS,
        token_type_ids=torch.zeros(3, 8, dtype=torch.long),
    )
    _raises(
        model,
        "token_type_ids must be an integer tensor; got torch.float32",
        input_ids=IDS,
        token_type_ids=torch.zeros(3, 9),
    )


def test_position_ids_out_of_range_shape_or_dtype(model):
    _raises(
        model,
        "position_ids must lie in [0, 64) (max_position_embeddings)",
        input_ids=IDS,
        position_ids=torch.arange(56, 65)[None],
    )
    _raises(model, "position_ids must lie in [0, 64)", input_ids=IDS, position_ids=torch.arange(-1, 8)[None])
    _raises(
        model,
        "position_ids must be [batch or 1, 9]; got shape (2, 9)",
        input_ids=IDS,
        position_ids=torch.arange(9).expand(2, 9),
    )
    _raises(
        model,
        "position_ids must be an integer tensor; got torch.float32",
        input_ids=IDS,
        position_ids=torch.arange(9.0)[None],
    )


@pytest.mark.parametrize("shape", [(3,), (5,), (3, 4), (2, 3), (2, 4, 1)])
def test_head_mask_of_the_wrong_shape(model, shape: tuple[int, ...]):
    _raises(
        model,
        f"head_mask must be [num_heads] = [4] or [num_layers, num_heads] = [2, 4]; got shape {shape}",
        input_ids=IDS,
        head_mask=torch.ones(shape),
    )


# ------------------------------------------------------------------------------------------------ outputs
def test_outputs_read_by_attribute_key_and_index(model):
    with torch.no_grad():
        out = model(**batch(), output_hidden_states=True, output_attentions=True)
    assert out["last_hidden_state"] is out.last_hidden_state is out[0]
    assert out["pooler_output"] is out.pooler_output is out[1]
    assert out["hidden_states"] is out.hidden_states is out[2]
    assert out["attentions"] is out.attentions is out[3]
    assert out.keys() == ["last_hidden_state", "pooler_output", "hidden_states", "attentions"]
    assert list(out) == out.keys()
    assert "past_key_values" not in out
    assert len(out.hidden_states) == 3
    assert out.attentions[0].shape == (3, 4, 9, 9)
    with pytest.raises(KeyError, match="no field 'logits' set"):
        out["logits"]
    first, pooled, *_ = out.to_tuple()
    assert first is out.last_hidden_state
    assert pooled is out.pooler_output


def test_return_dict_false_is_a_tuple_without_nones(model):
    inputs = batch()
    with torch.no_grad():
        out = model(**inputs)
        plain = model(**inputs, return_dict=False)
        with_hidden = model(**inputs, return_dict=False, output_hidden_states=True)
    assert type(plain) is tuple
    assert len(plain) == 2
    # the same forward pass, only packed differently: bit-equal
    assert torch.equal(plain[0], out.last_hidden_state)
    assert torch.equal(plain[1], out.pooler_output)
    assert len(with_hidden) == 3
    assert len(with_hidden[2]) == 3  # embeddings + 2 layers
