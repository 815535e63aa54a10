"""Numerical parity with the installed transformers' BertModel on the same weights (fp32, ≤ 1e-5)."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

import bertblocks
from tests.conftest import batch, max_diff
from tests.tolerances import assert_close, assert_grads_close


def _hf(directory, impl):
    return transformers.BertModel.from_pretrained(directory, attn_implementation=impl).eval()


def _compare(ours_out, hf_out, attentions=True, real=None):
    """All positions, or with ``real`` ([b, L] bool) only real tokens (and attention rows of real queries).

    A packed forward pass (the default in inference for padded batches) leaves zeros at padded positions,
    where transformers returns values nothing should read; those positions are compared only when packing
    is off.
    """

    def pick(t, rows=False):
        if real is None:
            return t
        return t.transpose(1, 2)[real] if rows else t[real]

    assert_close(pick(ours_out.last_hidden_state), pick(hf_out.last_hidden_state))
    assert_close(ours_out.pooler_output, hf_out.pooler_output)
    assert len(ours_out.hidden_states) == len(hf_out.hidden_states)
    for mine, theirs in zip(ours_out.hidden_states, hf_out.hidden_states, strict=True):
        assert_close(pick(mine), pick(theirs))
    if attentions:
        assert len(ours_out.attentions) == len(hf_out.attentions)
        for mine, theirs in zip(ours_out.attentions, hf_out.attentions, strict=True):
            assert_close(pick(mine, rows=True), pick(theirs, rows=True))


def _real(inputs):
    mask = inputs.get("attention_mask")
    return None if mask is None else mask.bool()


@pytest.mark.parametrize("packing", ["never", "auto"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_loaded_hf_checkpoint_matches_transformers(hf_checkpoint, backend, packing):
    directory = hf_checkpoint()
    hf = _hf(directory, "eager")  # eager returns attention maps in transformers v5
    ours = bertblocks.from_pretrained(directory, [f"encoder.packing={packing}"], attn_implementation=backend).eval()
    inputs = batch()
    with torch.no_grad():
        theirs = hf(**inputs, output_hidden_states=True, output_attentions=True)
        mine = ours(**inputs, output_hidden_states=True, output_attentions=True)
    _compare(mine, theirs, real=inputs["attention_mask"].bool() if packing == "auto" else None)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_fused_path_matches_transformers_sdpa(hf_checkpoint, backend):
    """Without output_attentions, SDPA runs fused; compare with transformers' own SDPA path."""
    directory = hf_checkpoint()
    hf = _hf(directory, "sdpa")
    ours = bertblocks.from_pretrained(directory, attn_implementation=backend).eval()
    for inputs in (batch(1), {"input_ids": batch(2)["input_ids"]}):
        with torch.no_grad():
            theirs = hf(**inputs, output_hidden_states=True)
            mine = ours(**inputs, output_hidden_states=True)
        _compare(mine, theirs, attentions=False, real=_real(inputs))


def test_saved_by_bertblocks_loads_in_transformers(tmp_path):
    torch.manual_seed(3)
    ours = bertblocks.create_model(
        {
            "vocab_size": 99,
            "hidden_size": 32,
            "max_position_embeddings": 64,
            "initializer_range": 0.2,
            "encoder": {
                "num_layers": 2,
                "attention": {"num_heads": 4},
                "feedforward": {"intermediate_size": 37},
            },
        }
    ).eval()
    ours.save_pretrained(tmp_path)
    hf, info = transformers.BertModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    hf.eval()
    inputs = batch(4)
    with torch.no_grad():
        _compare(
            ours(**inputs, output_hidden_states=True),
            hf(**inputs, output_hidden_states=True),
            attentions=False,
            real=_real(inputs),
        )


def test_state_dict_keys_are_hf_keys(hf_checkpoint):
    directory = hf_checkpoint()
    hf = _hf(directory, "eager")
    ours = bertblocks.from_pretrained(directory)
    assert list(ours.state_dict()) == list(hf.state_dict())


def test_chunked_feed_forward_matches_transformers(hf_checkpoint):
    directory = hf_checkpoint(chunk_size_feed_forward=3)  # transformers needs a divisor of the length
    hf = _hf(directory, "eager")
    ours = bertblocks.from_pretrained(directory)
    assert ours.config.encoder.chunk_size_feed_forward == 3
    ours.eval()
    inputs = batch(5)
    with torch.no_grad():
        _compare(
            ours(**inputs, output_hidden_states=True),
            hf(**inputs, output_hidden_states=True),
            attentions=False,
            real=_real(inputs),
        )
    unchunked = bertblocks.from_pretrained(directory, ["encoder.chunk_size_feed_forward=0"]).eval()
    uneven = bertblocks.from_pretrained(directory, ["encoder.chunk_size_feed_forward=4"]).eval()  # 4 + 4 + 1
    with torch.no_grad():
        # chunks are smaller GEMMs: another summation blocking, so fp32 parity, not bit equality
        assert_close(ours(**inputs)[0], unchunked(**inputs)[0], what="chunks of 3")
        assert_close(uneven(**inputs)[0], unchunked(**inputs)[0], what="chunks of 4 + 4 + 1")


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu", "silu", "gelu_pytorch_tanh", "quick_gelu", "mish"])
def test_activations_match_transformers(hf_checkpoint, act):
    directory = hf_checkpoint(hidden_act=act)
    hf = _hf(directory, "sdpa")
    ours = bertblocks.from_pretrained(directory).eval()
    inputs = batch(6)
    with torch.no_grad():
        real = inputs["attention_mask"].bool()
        assert_close(ours(**inputs)[0][real], hf(**inputs)[0][real])


def test_inputs_embeds_and_position_ids_match(hf_checkpoint):
    directory = hf_checkpoint()
    hf = _hf(directory, "sdpa")
    ours = bertblocks.from_pretrained(directory).eval()
    inputs = batch(7)
    embeds = torch.randn(3, 9, 32)
    positions = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        mine = ours(inputs_embeds=embeds, attention_mask=inputs["attention_mask"], position_ids=positions)
        theirs = hf(inputs_embeds=embeds, attention_mask=inputs["attention_mask"], position_ids=positions)
    real = inputs["attention_mask"].bool()
    assert_close(mine.last_hidden_state[real], theirs.last_hidden_state[real])


def test_three_d_mask_equals_its_two_d_form_and_masks_per_query(hf_checkpoint):
    # transformers 5 cannot take a 3-D mask any more (it fails inside masking_utils), so the 3-D path is
    # checked against the 2-D path it must equal, and for per-row masking.
    directory = hf_checkpoint()
    ours = bertblocks.from_pretrained(directory).eval()
    inputs = batch(8)
    mask2 = inputs["attention_mask"]
    mask3 = mask2[:, None, :].expand(3, 9, 9).clone()
    causal = torch.tril(torch.ones(9, 9, dtype=torch.long)).expand(3, 9, 9).clone()
    ids = inputs["input_ids"]
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 99
    with torch.no_grad():
        real = mask2.bool()  # the 2-D mask may take the packed path, which zeroes padded positions
        three_d = ours(input_ids=ids, attention_mask=mask3)[0]
        assert_close(three_d[real], ours(input_ids=ids, attention_mask=mask2)[0][real])
        before = ours(input_ids=ids, attention_mask=causal)[0]
        after = ours(input_ids=changed, attention_mask=causal)[0]
    # with a causal 3-D mask, positions before 5 cannot see the changed tokens
    assert_close(after[:, :5], before[:, :5])
    assert max_diff(before[:, 5:], after[:, 5:]) > 1e-3


def test_return_dict_false_gives_tuple(hf_checkpoint):
    directory = hf_checkpoint()
    ours = bertblocks.from_pretrained(directory).eval()
    inputs = batch(9)
    with torch.no_grad():
        out = ours(**inputs)
        tup = ours(**inputs, return_dict=False)
    assert isinstance(tup, tuple)
    assert len(tup) == 2
    assert torch.equal(tup[0], out.last_hidden_state)
    assert torch.equal(out["pooler_output"], out[1])


def test_training_mode_dropout_and_gradient_checkpointing_give_same_gradients(hf_checkpoint):
    directory = hf_checkpoint()
    inputs = batch(10)
    grads = []
    for checkpointing in (False, True):
        model = bertblocks.from_pretrained(directory, ["hidden_dropout_prob=0.0", "encoder.attention.dropout=0.0"])
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        out = model(**inputs)
        out.last_hidden_state.sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert_grads_close(grads[1][name], grads[0][name], what=name)


def test_no_pooler(hf_checkpoint, caplog):
    directory = hf_checkpoint()
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        ours, info = bertblocks.from_pretrained(directory, add_pooling_layer=False, output_loading_info=True)
    assert ours.pooler is None
    assert sorted(info.unexpected_keys) == ["pooler.dense.bias", "pooler.dense.weight"]
    out = ours(**batch())
    assert out.pooler_output is None
    assert out[0] is out.last_hidden_state
