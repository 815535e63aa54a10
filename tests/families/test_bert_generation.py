"""What the ``bert-generation`` row of tests/families/reference.py does not cover: the decoder as a decoder (causal,
with cross-attention and its key/value cache), BertGeneration2BertGeneration through transformers'
EncoderDecoderModel both ways (the published checkpoints' use: outputs, losses and generated tokens equal), the
untied language-model head, what a sparse config.json means, and the ablation's masked-LM task on a family whose
only language model is causal.
"""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

import bertblocks
from bertblocks.ablation.training import task_model
from bertblocks.errors import BertBlocksError, UnsupportedError
from bertblocks.hf.config_json import config_from_hf
from bertblocks.hf.weights import read_state_dict
from bertblocks.models.encoder_decoder import BertEncoderDecoder
from bertblocks.readers import read_json
from tests.families.reference import FAMILIES
from tests.tolerances import assert_close

ROW = FAMILIES["bert-generation"]
#: the decoder side: causal, with cross-attention (as EncoderDecoderModel builds it)
DECODER = {**ROW.settings, "is_decoder": True, "add_cross_attention": True}


def _ids(length: int = 7, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, -2:] = 0
    return ids.masked_fill(mask == 0, ROW.pad), mask


@pytest.fixture(scope="module")
def decoder_dir(tmp_path_factory):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = transformers.BertGenerationDecoder(transformers.BertGenerationConfig(**DECODER)).eval()
    directory = tmp_path_factory.mktemp("bert-generation-decoder")
    model.save_pretrained(directory)
    return directory


def test_the_decoder_with_cross_attention_and_its_cache_gives_transformers_numbers(decoder_dir):
    theirs = transformers.BertGenerationDecoder.from_pretrained(decoder_dir).eval()
    ours, info = bertblocks.from_pretrained(decoder_dir, head="auto", output_loading_info=True)
    ours.eval()
    assert info.missing_keys == info.unexpected_keys == []
    assert ours.config.is_decoder
    assert ours.config.add_cross_attention
    ids, mask = _ids()
    memory = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    memory_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    labels = ids.masked_fill(mask == 0, -100)
    cross = {"encoder_hidden_states": memory, "encoder_attention_mask": memory_mask}
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, labels=labels, **cross)
        got = ours(input_ids=ids, attention_mask=mask, labels=labels, **cross)
        assert_close(got.logits[mask.bool()], expected.logits[mask.bool()])
        assert_close(got.loss, expected.loss)
        # token by token with the cache: the last position's logits of every step are the full pass's
        full = theirs(input_ids=ids[:1], **{k: v[:1] for k, v in cross.items()}).logits
        cache = None
        for step in range(ids.shape[1]):
            out = ours(
                input_ids=ids[:1, step : step + 1],
                past_key_values=cache,
                use_cache=True,
                **{k: v[:1] for k, v in cross.items()},
            )
            cache = out.past_key_values
            assert_close(out.logits[:, -1], full[:, step], what=f"step {step}")


@pytest.fixture(scope="module")
def seq2seq_dir(tmp_path_factory):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    encoder = transformers.BertGenerationConfig(**ROW.settings)
    decoder = transformers.BertGenerationConfig(**DECODER)
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id = 2, 0  # <s>, <pad>
    directory = tmp_path_factory.mktemp("bertgeneration2bertgeneration")
    transformers.EncoderDecoderModel(config=config).eval().save_pretrained(directory)
    return directory


def test_transformers_bertgeneration2bertgeneration_loads_with_equal_outputs_and_tokens(seq2seq_dir):
    theirs = transformers.EncoderDecoderModel.from_pretrained(seq2seq_dir).eval()
    assert type(theirs.encoder).__name__ == "BertGenerationEncoder"
    assert type(theirs.decoder).__name__ == "BertGenerationDecoder"
    ours, info = BertEncoderDecoder.from_pretrained(seq2seq_dir, output_loading_info=True)
    assert not info.missing_keys
    assert not info.unexpected_keys
    ours.eval()
    assert ours.encoder.config.family == ours.decoder.config.family == "bert-generation"
    assert ours.decoder.config.head.name == "causal_lm_linear"
    ids, mask = _ids()
    labels = torch.randint(5, 99, (2, 5), generator=torch.Generator().manual_seed(3))
    labels[1, -1] = -100
    with torch.no_grad():
        a = theirs(input_ids=ids, attention_mask=mask, labels=labels)
        b = ours(input_ids=ids, attention_mask=mask, labels=labels)
    assert_close(b.logits, a.logits)
    assert_close(b.loss, a.loss)
    assert torch.equal(
        ours.generate(ids, mask, max_new_tokens=8),
        theirs.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False),
    )


def test_saved_bertgeneration2bertgeneration_loads_in_transformers_with_its_classes(seq2seq_dir, tmp_path):
    ours = BertEncoderDecoder.from_pretrained(seq2seq_dir).eval()
    ours.save_pretrained(tmp_path)
    saved = read_json(tmp_path / "config.json")
    assert saved["encoder"]["model_type"] == saved["decoder"]["model_type"] == "bert-generation"
    assert saved["encoder"]["architectures"] == ["BertGenerationEncoder"]
    assert saved["decoder"]["architectures"] == ["BertGenerationDecoder"]
    assert "type_vocab_size" not in saved["encoder"]  # BertGenerationConfig has none
    # transformers' key layout: the same key set it writes itself
    stored = read_state_dict([tmp_path / "model.safetensors"])
    assert set(stored) == set(read_state_dict([seq2seq_dir / "model.safetensors"]))
    theirs, info = transformers.EncoderDecoderModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    ids, mask = _ids()
    with torch.no_grad():
        assert_close(
            ours(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits,
            theirs.eval()(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits,
        )


def test_an_untied_language_model_head_is_refused_both_ways(tmp_path):
    """Untied, transformers keeps the decoder's bias twice (one read, one not): refused on load and on save."""
    torch.manual_seed(0)
    config = transformers.BertGenerationConfig(**ROW.settings, is_decoder=True, tie_word_embeddings=False)
    theirs = transformers.BertGenerationDecoder(config)
    assert theirs.lm_head.decoder.bias is not theirs.lm_head.bias  # what makes the layout ambiguous
    theirs.save_pretrained(tmp_path / "hf")
    with pytest.raises(BertBlocksError, match="tie_word_embeddings=False is not supported for BertGenerationDecoder"):
        bertblocks.from_pretrained(tmp_path / "hf", head="auto")
    ours = bertblocks.create_model("tiny-bert-generation", ["tie_word_embeddings=false"], head="causal_lm_linear")
    with pytest.raises(BertBlocksError, match=r"cannot write a bert-generation config\.json: tie_word_embeddings"):
        ours.save_pretrained(tmp_path / "ours")
    # the backbone alone has no language-model head: untied is nothing to refuse
    bertblocks.create_model("tiny-bert-generation", ["tie_word_embeddings=false"]).save_pretrained(tmp_path / "enc")


def test_a_sparse_config_json_means_bert_generation_config_defaults():
    config = bertblocks.load_config(config_from_hf({"model_type": "bert-generation"}))
    expected = transformers.BertGenerationConfig()
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (
        expected.vocab_size,
        expected.hidden_size,
        expected.num_hidden_layers,
    )
    assert (config.num_attention_heads, config.intermediate_size) == (16, 4096)
    assert config.pooler is None
    assert config.embedding.options()["token_types"] is False


def test_the_ablation_mlm_task_trains_bert_masked_lm_head_on_a_family_without_one():
    config = bertblocks.load_config("tiny-bert-generation")
    model = task_model("mlm", config)
    assert model.config.head.name == "masked_lm"
    assert model.config.family == "bert-generation"
    with pytest.raises(UnsupportedError, match="bert-generation family has no SequenceClassification head"):
        task_model("classification", config)
