"""What the reference rows of RoBERTa-PreLayerNorm, MegatronBERT, XLM-RoBERTa-XL and Data2VecText do not cover: dropout.

The rows compare evaluation outputs; here the models train. With the same seed, bertblocks' model and transformers'
draw the same dropout masks in the same order only if both apply dropout at the same places with the same shapes,
so equal training outputs show that the dropout layout is transformers' (XLM-R-XL's feed-forward output has none,
its attention output has one; the embeddings of every family drop out once).
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import transformers

import bertblocks
from bertblocks.hf.config_json import config_from_hf
from tests.conftest import TINY_HF
from tests.tolerances import assert_close

#: transformers' backbone class of each family
BACKBONES = {
    "roberta-prelayernorm": "RobertaPreLayerNormModel",
    "megatron-bert": "MegatronBertModel",
    "xlm-roberta-xl": "XLMRobertaXLModel",
    "data2vec-text": "Data2VecTextModel",
}


def _checkpoint(tmp_path, family: str) -> tuple[torch.nn.Module, str]:
    """transformers' backbone with dropout on the hidden states only (attention dropout would draw differently
    shaped masks under different attention kernels), saved."""
    settings = {**TINY_HF, "type_vocab_size": 1, "pad_token_id": 1, "hidden_dropout_prob": 0.3}
    config = transformers.AutoConfig.for_model(family, **settings, attention_probs_dropout_prob=0.0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, BACKBONES[family])(config).train()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(tmp_path)
    return model, str(tmp_path)


def _train_outputs(theirs: torch.nn.Module, ours: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[0, 5, 17, 42, 8, 33, 2], [0, 61, 9, 12, 2, 1, 1]])
    mask = (ids != 1).long()
    torch.manual_seed(1)
    expected = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.manual_seed(1)
    got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    return got[mask.bool()], expected[mask.bool()]


@pytest.mark.parametrize("family", list(BACKBONES))
def test_training_draws_the_dropout_masks_transformers_draws(tmp_path, family):
    theirs, folder = _checkpoint(tmp_path, family)
    ours = bertblocks.from_pretrained(folder).train()
    got, expected = _train_outputs(theirs, ours)
    assert_close(got, expected)
    # and dropout really ran: evaluation gives other numbers
    ours.eval()
    assert not torch.allclose(got, _train_outputs(theirs.eval(), ours)[0])


def test_xlm_roberta_xl_feed_forward_output_has_no_dropout(tmp_path):
    """The family's ``encoder.feedforward.output_dropout: false``: with BERT's dropout there, training differs."""
    theirs, folder = _checkpoint(tmp_path, "xlm-roberta-xl")
    ours = bertblocks.from_pretrained(folder)
    assert ours.config.encoder.feedforward.options().get("output_dropout") is False
    with_dropout = bertblocks.from_pretrained(folder, overrides={"encoder.feedforward.output_dropout": True}).train()
    got, expected = _train_outputs(theirs, with_dropout)
    assert not torch.allclose(got, expected, atol=1e-3)


#: facebook/xlm-roberta-xl's config.json as recalled (fields the rows' transformers-written files lack:
#: tokenizer_class, output_past, torch_dtype, position_embedding_type); not a verbatim fixture (those live in
#: tests/fixtures/published_configs/ with their provenance)
XLM_ROBERTA_XL_RECALLED = {
    "architectures": ["XLMRobertaXLForMaskedLM"],
    "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0,
    "classifier_dropout": None,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 10240,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 514,
    "model_type": "xlm-roberta-xl",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "output_past": True,
    "pad_token_id": 1,
    "position_embedding_type": "absolute",
    "tokenizer_class": "XLMRobertaTokenizer",
    "torch_dtype": "float32",
    "transformers_version": "4.17.0.dev0",
    "type_vocab_size": 1,
    "use_cache": True,
    "vocab_size": 250880,
}


def test_xlm_roberta_xl_config_json_reads_quietly_into_the_preset_shape():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = bertblocks.load_config(config_from_hf(XLM_ROBERTA_XL_RECALLED))
    preset = bertblocks.load_config("xlm-roberta-xl")
    assert config.model_copy(update={"head": None, "hf": {}}) == preset.model_copy(update={"hf": {}})
    assert config.head is not None
    assert config.head.name == "masked_lm_gelu"


@pytest.mark.parametrize("family", list(BACKBONES))
def test_a_sparse_config_json_means_the_config_class_defaults(family):
    """A field left out means what transformers' config class defaults it to (XLM-R-XL's are its published
    model's), not BERT's."""
    config = bertblocks.load_config(config_from_hf({"model_type": family}))
    reference = transformers.AutoConfig.for_model(family)
    assert (
        config.vocab_size,
        config.hidden_size,
        config.encoder.num_layers,
        config.encoder.attention.num_heads,
        config.encoder.feedforward.intermediate_size,
        config.max_position_embeddings,
        config.type_vocab_size,
        config.pad_token_id,
        config.layer_norm_eps,
    ) == (
        reference.vocab_size,
        reference.hidden_size,
        reference.num_hidden_layers,
        reference.num_attention_heads,
        reference.intermediate_size,
        reference.max_position_embeddings,
        reference.type_vocab_size,
        reference.pad_token_id,
        reference.layer_norm_eps,
    )
