"""Decoder mode: causal self-attention, cross-attention and the KV cache.

Parity with transformers' BertModel in decoder mode (the LM-head parity lives with the heads), relative
schemes against transformers 4.46.3 fixtures, and incremental decoding equal to the full forward.
"""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from safetensors.torch import load_file

import bertblocks
from bertblocks.core.cache import KVCache
from tests.conftest import TINY, V4, to_device
from tests.tolerances import assert_close, assert_identical

DECODER = {**TINY, "is_decoder": True, "add_cross_attention": True, "initializer_range": 0.2}


@pytest.fixture
def hf_decoder_dir(hf_checkpoint):
    return hf_checkpoint(is_decoder=True, add_cross_attention=True)


def _hf(directory):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()


def _inputs(seed=0, length=8):
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(1, 99, (2, length), generator=g),
        "encoder_hidden_states": torch.randn(2, 5, 32, generator=g),
    }


PADDINGS = {
    "none": (None, None),
    "left": (torch.tensor([[1] * 8, [0, 0] + [1] * 6]), None),
    "right": (torch.tensor([[1] * 8, [1] * 6 + [0, 0]]), None),
    "encoder": (None, torch.tensor([[1] * 5, [1] * 4 + [0]])),
}


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("padding", list(PADDINGS))
def test_decoder_matches_transformers(hf_decoder_dir, backend, padding):
    hf = _hf(hf_decoder_dir)
    ours = bertblocks.from_pretrained(hf_decoder_dir, attn_implementation=backend).eval()
    mask, encoder_mask = PADDINGS[padding]
    kwargs = {**_inputs(), "attention_mask": mask, "encoder_attention_mask": encoder_mask}
    with torch.no_grad():
        theirs = hf(**kwargs, output_attentions=True, output_hidden_states=True)
        mine = ours(**kwargs, output_attentions=True, output_hidden_states=True)
        fused = ours(**kwargs)
    assert_close(mine.last_hidden_state, theirs.last_hidden_state)
    assert_close(fused.last_hidden_state, theirs.last_hidden_state)
    for field in ("hidden_states", "attentions", "cross_attentions"):
        pairs = list(zip(getattr(mine, field), getattr(theirs, field), strict=True))
        assert pairs
        for a, b in pairs:
            assert_close(a, b, what=field)


def test_cached_steps_match_transformers(hf_decoder_dir):
    hf = _hf(hf_decoder_dir)
    ours = bertblocks.from_pretrained(hf_decoder_dir).eval()
    x = _inputs(1)
    enc = x["encoder_hidden_states"]
    with torch.no_grad():
        theirs = hf(input_ids=x["input_ids"][:, :5], encoder_hidden_states=enc, use_cache=True)
        mine = ours(input_ids=x["input_ids"][:, :5], encoder_hidden_states=enc, use_cache=True)
        assert_close(mine.last_hidden_state, theirs.last_hidden_state)
        cache_theirs, cache_mine = theirs.past_key_values, mine.past_key_values
        for j in range(5, 8):
            step = x["input_ids"][:, j : j + 1]
            theirs = hf(input_ids=step, encoder_hidden_states=enc, past_key_values=cache_theirs, use_cache=True)
            mine = ours(input_ids=step, encoder_hidden_states=enc, past_key_values=cache_mine, use_cache=True)
            cache_theirs = theirs.past_key_values
            assert mine.past_key_values is cache_mine
            assert_close(mine.last_hidden_state, theirs.last_hidden_state)
    assert cache_mine.get_seq_length() == 8


def _random_decoder(position, backend, cross=True, seed=0):
    torch.manual_seed(seed)
    config = {**DECODER, "add_cross_attention": cross, "position": position}
    model = bertblocks.create_model(config, [f"encoder.attention.backend={backend}"]).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "distance_embedding" in name:
                param.normal_()  # unit scale, so a position error shows
    return model


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("position", ["absolute", "relative_key", "relative_key_query"])
@pytest.mark.parametrize("chunks", [(3, 1, 1, 1, 1, 1), (3, 2, 3), (1, 4, 3), (8,)])
def test_incremental_decoding_equals_full_forward(position, backend, chunks, device):
    """Prefix + one-token steps, and prefix + multi-token chunks, give the full forward's outputs (fp32)."""
    model = _random_decoder(position, backend).to(device)
    x = to_device(_inputs(2), device)
    mask = torch.tensor([[1] * 8, [0, 1] + [1] * 6], device=device)  # a left-padded row too
    with torch.no_grad():
        full = model(**x, attention_mask=mask, use_cache=False).last_hidden_state
        cache, start, outs = None, 0, []
        for size in chunks:
            out = model(
                input_ids=x["input_ids"][:, start : start + size],
                attention_mask=mask[:, : start + size],
                encoder_hidden_states=x["encoder_hidden_states"],
                past_key_values=cache,
                use_cache=True,
            )
            cache, start = out.past_key_values, start + size
            outs.append(out.last_hidden_state)
    # A fully padded query row attends uniformly to whatever keys exist (HF's semantics), so it differs
    # between a chunked and a full run; it feeds no other position. Real tokens must agree exactly.
    real = mask.bool()
    assert_close(torch.cat(outs, dim=1)[real], full[real])


@pytest.mark.parametrize("case", ["decoder_absolute", "decoder_relative_key", "decoder_relative_key_query"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_decoder_matches_transformers_4_fixtures(case, backend):
    """Hidden states and self/cross attention of transformers 4.46.3's BertLMHeadModel backbone."""
    io = load_file(V4 / case / "io.safetensors")
    model = bertblocks.from_pretrained(V4 / case, attn_implementation=backend, add_pooling_layer=False).eval()
    with torch.no_grad():
        out = model(
            input_ids=io["input_ids"],
            attention_mask=io["attention_mask"],
            encoder_hidden_states=io["encoder_hidden_states"],
            encoder_attention_mask=io["encoder_attention_mask"],
            output_hidden_states=True,
            output_attentions=True,
        )
    for i, hidden in enumerate(out.hidden_states):
        assert_close(hidden, io[f"hidden_states_{i}"])
    for i, (a, c) in enumerate(zip(out.attentions, out.cross_attentions, strict=True)):
        assert_close(a, io[f"attentions_{i}"])
        assert_close(c, io[f"cross_attentions_{i}"])


def test_saved_decoder_loads_in_transformers(tmp_path):
    ours = _random_decoder("absolute", "sdpa")
    ours.save_pretrained(tmp_path)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf, info = transformers.BertModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert hf.config.is_decoder
    assert hf.config.add_cross_attention
    x = _inputs(3)
    with torch.no_grad():
        assert_close(ours(**x).last_hidden_state, hf.eval()(**x).last_hidden_state)


def test_cross_attention_keys_and_no_distance_table():
    model = _random_decoder("relative_key", "sdpa")
    keys = model.state_dict().keys()
    assert "encoder.layer.0.crossattention.self.query.weight" in keys
    assert "encoder.layer.0.crossattention.output.LayerNorm.weight" in keys
    assert "encoder.layer.0.attention.self.distance_embedding.weight" in keys
    assert not any("crossattention.self.distance_embedding" in k for k in keys)


# -------------------------------------------------------------------------------------------- the cache
def test_cache_stays_out_of_the_state_dict_and_grows():
    model = _random_decoder("absolute", "sdpa")
    before = set(model.state_dict())
    x = _inputs(4)
    with torch.no_grad():
        out = model(**x, use_cache=True)
    assert set(model.state_dict()) == before
    cache = out.past_key_values
    assert isinstance(cache, KVCache)
    assert cache.get_seq_length() == 8
    k, _ = cache.layer(0)
    assert k.shape == (2, 4, 8, 8)
    assert cache.cross(0)[0].shape == (2, 4, 5, 8)


def test_cache_reorder_and_crop():
    model = _random_decoder("relative_key", "sdpa")
    x = _inputs(5)
    ids, enc = x["input_ids"], x["encoder_hidden_states"]
    with torch.no_grad():
        cache = model(input_ids=ids[:, :6], encoder_hidden_states=enc, use_cache=True).past_key_values
        # reorder: swapping the rows of the cache equals running the swapped batch
        swapped = model(input_ids=ids.flip(0)[:, :6], encoder_hidden_states=enc.flip(0), use_cache=True)
        cache.reorder(torch.tensor([1, 0]))
        a = model(input_ids=ids.flip(0)[:, 6:7], encoder_hidden_states=enc.flip(0), past_key_values=cache)
        b = model(
            input_ids=ids.flip(0)[:, 6:7], encoder_hidden_states=enc.flip(0), past_key_values=swapped.past_key_values
        )
        assert_close(a.last_hidden_state, b.last_hidden_state)  # rows in another order: other GEMM blocking
        # crop: back to 4 tokens, then continue as if the last ones were never seen
        cache.crop(4)
        assert cache.get_seq_length() == 4
        c = model(input_ids=ids.flip(0)[:, 4:8], encoder_hidden_states=enc.flip(0), past_key_values=cache)
        full = model(input_ids=ids.flip(0), encoder_hidden_states=enc.flip(0), use_cache=False)
    assert_close(c.last_hidden_state, full.last_hidden_state[:, 4:])


def test_legacy_tuple_cache_round_trip():
    model = _random_decoder("absolute", "eager")
    x = _inputs(6)
    ids, enc = x["input_ids"], x["encoder_hidden_states"]
    with torch.no_grad():
        cache = model(input_ids=ids[:, :5], encoder_hidden_states=enc, use_cache=True).past_key_values
        legacy = cache.to_legacy()
        assert len(legacy) == 2
        assert len(legacy[0]) == 4
        a = model(input_ids=ids[:, 5:], encoder_hidden_states=enc, past_key_values=legacy)
        b = model(input_ids=ids[:, 5:], encoder_hidden_states=enc, past_key_values=cache)
    # the tuple holds the cache's own tensors: the same kernels on the same data
    assert_identical(a.last_hidden_state, b.last_hidden_state)


def test_use_cache_defaults():
    decoder = _random_decoder("absolute", "sdpa", cross=False)
    encoder = bertblocks.create_model(TINY).eval()
    ids = _inputs(7)["input_ids"]
    with torch.no_grad():
        assert isinstance(decoder(input_ids=ids).past_key_values, KVCache)  # config.use_cache
        assert decoder(input_ids=ids, use_cache=False).past_key_values is None
        assert encoder(input_ids=ids, use_cache=True).past_key_values is None  # encoders never cache
    decoder.train()
    decoder.gradient_checkpointing_enable()
    assert decoder(input_ids=ids, use_cache=True).past_key_values is None


# ------------------------------------------------------------------------------------------- bad input
def test_cross_attention_without_decoder_is_a_config_error():
    with pytest.raises(bertblocks.config.ConfigError, match="add_cross_attention: cross-attention needs is_decoder"):
        bertblocks.create_model({**TINY, "add_cross_attention": True})


def test_encoder_states_for_a_model_without_cross_attention():
    model = _random_decoder("absolute", "sdpa", cross=False)
    with pytest.raises(ValueError, match="no cross-attention layers"):
        model(**_inputs())


def test_cross_attention_model_needs_encoder_states():
    model = _random_decoder("absolute", "sdpa")
    with pytest.raises(ValueError, match="pass encoder_hidden_states"):
        model(input_ids=_inputs()["input_ids"])


def test_cache_from_a_model_of_another_shape():
    small = _random_decoder("absolute", "sdpa", cross=False)
    other = bertblocks.create_model(
        {**DECODER, "add_cross_attention": False, "encoder": {**TINY["encoder"], "attention": {"num_heads": 2}}}
    ).eval()
    ids = _inputs()["input_ids"]
    with torch.no_grad():
        cache = other(input_ids=ids, use_cache=True).past_key_values
        with pytest.raises(ValueError, match="another shape"):
            small(input_ids=ids[:, :1], past_key_values=cache)
        three = bertblocks.create_model(
            {**DECODER, "add_cross_attention": False, "encoder": {**TINY["encoder"], "num_layers": 3}}
        ).eval()
        with pytest.raises(ValueError, match="3 layers but this model has 2"):
            small(input_ids=ids[:, :1], past_key_values=three(input_ids=ids).past_key_values)


def test_positions_past_max_position_embeddings_with_cache():
    model = _random_decoder("absolute", "sdpa", cross=False)
    ids = torch.randint(1, 99, (1, 60))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        with pytest.raises(ValueError, match="after 60 cached tokens exceeds max_position_embeddings=64"):
            model(input_ids=ids[:, :5], past_key_values=cache)


def test_mask_shorter_than_cache_plus_input():
    model = _random_decoder("absolute", "sdpa", cross=False)
    ids = _inputs()["input_ids"]
    with torch.no_grad():
        cache = model(input_ids=ids[:, :5], use_cache=True).past_key_values
        with pytest.raises(ValueError, match=r"needs \(2, 6\).*cached positions"):
            model(input_ids=ids[:, 5:6], attention_mask=torch.ones(2, 1), past_key_values=cache)


def test_cache_for_an_encoder_is_refused():
    encoder = bertblocks.create_model(TINY).eval()
    with pytest.raises(ValueError, match="not a decoder"):
        encoder(input_ids=_inputs()["input_ids"], past_key_values=KVCache(2))
