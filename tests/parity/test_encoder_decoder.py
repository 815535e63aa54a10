"""BERT2BERT: parity with transformers' EncoderDecoderModel (forward, loss, generate) and checkpoint exchange."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

from bertblocks import create_model
from bertblocks.models.encoder_decoder import BertEncoderDecoder, shift_tokens_right
from tests.conftest import TINY, TINY_HF
from tests.tolerances import assert_close


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    encoder = transformers.BertConfig(**TINY_HF)
    # a wider decoder, so the encoder→decoder projection is exercised too
    decoder = transformers.BertConfig(**{**TINY_HF, "hidden_size": 48}, is_decoder=True, add_cross_attention=True)
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id = 2, 0
    directory = tmp_path_factory.mktemp("bert2bert")
    transformers.EncoderDecoderModel(config=config).eval().save_pretrained(directory)
    return directory


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, -2:] = 0
    labels = torch.randint(1, 99, (2, 5), generator=g)
    labels[1, -1] = -100
    return ids, mask, labels


def test_forward_and_loss_match_transformers(hf_dir):
    # eager: transformers' SDPA path returns no attention maps
    hf = transformers.EncoderDecoderModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    ours, info = BertEncoderDecoder.from_pretrained(hf_dir, output_loading_info=True)
    assert not info.missing_keys
    assert not info.unexpected_keys
    ours.eval()
    ids, mask, labels = _inputs()
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, labels=labels, output_attentions=True)
        b = ours(input_ids=ids, attention_mask=mask, labels=labels, output_attentions=True)
    assert_close(a.logits, b.logits)
    assert_close(a.loss, b.loss)
    assert len(b.cross_attentions) == 2
    for x, y in zip(a.cross_attentions, b.cross_attentions, strict=True):
        assert_close(x, y)


def test_generate_matches_transformers(hf_dir):
    hf = transformers.EncoderDecoderModel.from_pretrained(hf_dir).eval()
    ours = BertEncoderDecoder.from_pretrained(hf_dir).eval()
    ids, mask, _ = _inputs()
    assert torch.equal(
        ours.generate(ids, mask, max_new_tokens=6),
        hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False),
    )


def test_saved_checkpoint_loads_in_transformers(hf_dir, tmp_path):
    ours = BertEncoderDecoder.from_pretrained(hf_dir).eval()
    ours.save_pretrained(tmp_path)
    hf, info = transformers.EncoderDecoderModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    ids, mask, labels = _inputs()
    with torch.no_grad():
        assert_close(
            ours(input_ids=ids, attention_mask=mask, labels=labels).logits,
            hf.eval()(input_ids=ids, attention_mask=mask, labels=labels).logits,
        )


def test_built_from_one_config_and_trains():
    ours = create_model({"encoder": TINY, "decoder": TINY, "decoder_start_token_id": 1, "pad_token_id": 0})
    assert ours.decoder.config.is_decoder
    assert ours.decoder.config.add_cross_attention
    assert not ours.projects
    ids, mask, labels = _inputs()
    loss = ours(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert ours.encoder.embeddings.word_embeddings.weight.grad is not None  # gradients reach the encoder


def test_shift_tokens_right():
    labels = torch.tensor([[5, 6, -100]])
    assert shift_tokens_right(labels, 0, 9).tolist() == [[9, 5, 6]]
    assert shift_tokens_right(torch.tensor([[5, -100, 7]]), 0, 9).tolist() == [[9, 5, 0]]


def test_bad_input():
    ours = create_model({"encoder": TINY, "decoder": TINY, "decoder_start_token_id": 1, "pad_token_id": 0})
    ids, mask, _ = _inputs()
    with pytest.raises(ValueError, match="decoder_input_ids, or labels"):
        ours(input_ids=ids, attention_mask=mask)
    with pytest.raises(FileNotFoundError, match=r"no/such/file\.yaml is not a directory"):
        BertEncoderDecoder.from_pretrained("no/such/file.yaml", local_files_only=True)
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        create_model({"encoder": TINY, "decoder": TINY})
