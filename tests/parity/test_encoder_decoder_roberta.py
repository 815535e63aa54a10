"""RoBERTa2RoBERTa: the encoder-decoder goes through each side's family (its prefix, key map and class names),
so a checkpoint of transformers' EncoderDecoderModel with RoBERTa on both sides moves between the two unchanged."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

from bertblocks.hf.weights import read_state_dict
from bertblocks.models.encoder_decoder import BertEncoderDecoder
from bertblocks.readers import read_json
from tests.conftest import TINY_HF
from tests.tolerances import assert_close

ROBERTA = {**TINY_HF, "max_position_embeddings": 66, "pad_token_id": 1, "type_vocab_size": 1}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    encoder = transformers.RobertaConfig(**ROBERTA)
    decoder = transformers.RobertaConfig(**ROBERTA, is_decoder=True, add_cross_attention=True)
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id = 0, 1
    directory = tmp_path_factory.mktemp("roberta2roberta")
    transformers.EncoderDecoderModel(config=config).eval().save_pretrained(directory)
    return directory


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 99, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, -2:] = 0
    ids[1, -2:] = 1  # RoBERTa's positions count from the padding id: padding must be the pad token
    labels = torch.randint(3, 99, (2, 5), generator=g)
    labels[1, -1] = -100
    return ids, mask, labels


def test_transformers_roberta2roberta_loads_with_equal_outputs_and_tokens(hf_dir):
    hf = transformers.EncoderDecoderModel.from_pretrained(hf_dir).eval()
    ours, info = BertEncoderDecoder.from_pretrained(hf_dir, output_loading_info=True)
    assert not info.missing_keys
    assert not info.unexpected_keys
    ours.eval()
    assert ours.encoder.config.family == ours.decoder.config.family == "roberta"
    ids, mask, labels = _inputs()
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, labels=labels)
        b = ours(input_ids=ids, attention_mask=mask, labels=labels)
    assert_close(a.logits, b.logits)
    assert_close(a.loss, b.loss)
    assert torch.equal(
        ours.generate(ids, mask, max_new_tokens=6),
        hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False),
    )


def test_saved_roberta2roberta_names_its_family_and_loads_in_transformers(hf_dir, tmp_path):
    ours = BertEncoderDecoder.from_pretrained(hf_dir).eval()
    ours.save_pretrained(tmp_path)
    saved = read_json(tmp_path / "config.json")
    assert saved["encoder"]["model_type"] == saved["decoder"]["model_type"] == "roberta"
    assert saved["encoder"]["architectures"] == ["RobertaModel"]
    assert saved["decoder"]["architectures"] == ["RobertaForCausalLM"]
    # RoBERTa's key layout, not BERT's: the same key set transformers itself writes
    stored = read_state_dict([tmp_path / "model.safetensors"])
    assert set(stored) == set(read_state_dict([hf_dir / "model.safetensors"]))
    hf, info = transformers.EncoderDecoderModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert type(hf.encoder).__name__ == "RobertaModel"
    assert type(hf.decoder).__name__ == "RobertaForCausalLM"
    ids, mask, labels = _inputs()
    with torch.no_grad():
        assert_close(
            ours(input_ids=ids, attention_mask=mask, labels=labels).logits,
            hf.eval()(input_ids=ids, attention_mask=mask, labels=labels).logits,
        )
