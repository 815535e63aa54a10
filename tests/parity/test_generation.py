"""Generation with the KV cache: parity with transformers' generate, padding, sampling, eos, bad input;
and the causal-LM head in decoder mode against transformers 4.46.3 fixtures (one-token cached steps)."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from safetensors.torch import load_file

import bertblocks
from bertblocks.models.generation import generate, left_align
from tests.conftest import TINY_HF, V4
from tests.tolerances import assert_close


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.BertConfig(**TINY_HF, is_decoder=True)
    directory = tmp_path_factory.mktemp("lm")
    transformers.BertLMHeadModel(config).eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def pair(lm_dir):
    hf = transformers.BertLMHeadModel.from_pretrained(lm_dir).eval()
    ours = bertblocks.BertLMHeadModel.from_pretrained(lm_dir).eval()
    return hf, ours


PROMPTS = torch.tensor([[8, 74, 25, 71, 89], [72, 23, 30, 90, 24]])


@pytest.mark.parametrize("mask", [None, torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])])
def test_greedy_equals_transformers_generate(pair, mask):
    hf, ours = pair
    theirs = hf.generate(PROMPTS, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    mine = generate(ours, PROMPTS, mask, max_new_tokens=10)
    assert torch.equal(mine, theirs)


def test_cache_and_no_cache_give_the_same_tokens(pair):
    _, ours = pair
    assert torch.equal(
        generate(ours, PROMPTS, max_new_tokens=12), generate(ours, PROMPTS, max_new_tokens=12, use_cache=False)
    )


def test_padded_rows_generate_what_they_generate_alone(pair):
    _, ours = pair
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    right = left.flip(1)
    ids_right = torch.stack([torch.cat([PROMPTS[0, 2:], PROMPTS[0, :2]]), PROMPTS[1]])
    batched_left = generate(ours, PROMPTS, left, max_new_tokens=8)
    batched_right = generate(ours, ids_right, right, max_new_tokens=8)
    alone = generate(ours, PROMPTS[:1, 2:], max_new_tokens=8)
    assert torch.equal(batched_left[0, 2:], alone[0])
    assert torch.equal(batched_right[:, 5:], batched_left[:, 5:])  # right padding is moved to the left
    assert torch.equal(batched_left[1], generate(ours, PROMPTS[1:], max_new_tokens=8)[0])


def test_left_align():
    ids = torch.tensor([[5, 6, 0, 0], [0, 7, 8, 9], [1, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1]])
    out_ids, out_mask = left_align(ids, mask)
    assert out_mask.tolist() == [[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]]
    assert out_ids[out_mask.bool()].tolist() == [5, 6, 7, 8, 9, 1, 2, 3, 4]


def test_sampling_is_reproducible_and_filters_work(pair):
    _, ours = pair

    def sample(seed, **kw):
        return generate(
            ours, PROMPTS, max_new_tokens=10, do_sample=True, generator=torch.Generator().manual_seed(seed), **kw
        )

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1, temperature=5.0), sample(2, temperature=5.0))
    greedy = generate(ours, PROMPTS, max_new_tokens=10)
    assert torch.equal(sample(3, top_k=1), greedy)
    assert torch.equal(sample(4, top_p=1e-6), greedy)  # the nucleus keeps the single most likely token


def test_eos_stops_rows_and_pads_after(pair):
    _, ours = pair
    free = generate(ours, PROMPTS, max_new_tokens=10)
    eos = int(free[0, 7])  # the third generated token of row 0
    out = generate(ours, PROMPTS, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    row0 = out[0, 5:].tolist()
    stop = row0.index(eos)
    assert all(t == 0 for t in row0[stop + 1 :])
    # generation ends as soon as every row has finished
    both = generate(ours, PROMPTS[:1], max_new_tokens=10, eos_token_id=eos)
    assert both.shape[1] == 5 + stop + 1


def test_generation_with_cross_attention_matches_transformers(tmp_path):
    torch.manual_seed(1)
    config = transformers.BertConfig(**TINY_HF, is_decoder=True, add_cross_attention=True)
    transformers.BertLMHeadModel(config).eval().save_pretrained(tmp_path)
    hf = transformers.BertLMHeadModel.from_pretrained(tmp_path).eval()
    ours = bertblocks.BertLMHeadModel.from_pretrained(tmp_path).eval()
    enc = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(0))
    enc_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    mine = generate(ours, PROMPTS, max_new_tokens=6, encoder_hidden_states=enc, encoder_attention_mask=enc_mask)
    # reference: transformers' forward, greedy, without its cache
    seq = PROMPTS
    with torch.no_grad():
        for _ in range(6):
            logits = hf(input_ids=seq, encoder_hidden_states=enc, encoder_attention_mask=enc_mask).logits
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(mine, seq)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": torch.ones(2, 3, 4, dtype=torch.long)}, "input_ids must be"),
        ({"attention_mask": torch.ones(2, 4)}, "attention_mask must have the shape"),
        ({"attention_mask": torch.tensor([[0] * 5, [1] * 5])}, "at least one real token"),
        ({"do_sample": True, "temperature": 0.0}, "temperature > 0"),
        ({"do_sample": True, "top_p": 0.0}, "top_p"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
    ],
)
def test_bad_generation_input(pair, kwargs, message):
    _, ours = pair
    args = {"input_ids": PROMPTS, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate(ours, args.pop("input_ids"), **args)


# ------------------------------------------------------------ causal-LM head, decoder mode, v4 fixtures
@pytest.mark.parametrize("case", ["decoder_absolute", "decoder_relative_key", "decoder_relative_key_query"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_lm_head_decoder_matches_transformers_4(case, backend):
    io = load_file(V4 / case / "io.safetensors")
    model = bertblocks.BertLMHeadModel.from_pretrained(V4 / case, attn_implementation=backend).eval()
    enc = {"encoder_hidden_states": io["encoder_hidden_states"], "encoder_attention_mask": io["encoder_attention_mask"]}
    ids, mask = io["input_ids"], io["attention_mask"]
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, labels=io["labels"], **enc)
        assert_close(full.logits, io["logits"])
        assert_close(full.loss, io["loss"])
        step = model(input_ids=ids[:, :3], attention_mask=mask[:, :3], use_cache=True, **enc)
        assert_close(step.logits, io["step_logits_prefix"])
        for j in range(3):
            step = model(
                input_ids=ids[:, 3 + j : 4 + j],
                attention_mask=mask[:, : 4 + j],
                past_key_values=step.past_key_values,
                use_cache=True,
                **enc,
            )
            assert_close(step.logits, io[f"step_logits_{j}"])


def test_lm_head_decoder_saves_for_transformers(tmp_path, lm_dir):
    ours = bertblocks.BertLMHeadModel.from_pretrained(lm_dir).eval()
    ours.save_pretrained(tmp_path)
    hf, info = transformers.BertLMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    with torch.no_grad():
        labels = PROMPTS.clone()
        a, b = ours(input_ids=PROMPTS, labels=labels), hf.eval()(input_ids=PROMPTS, labels=labels)
    assert_close(a.logits, b.logits)
    assert_close(a.loss, b.loss)
