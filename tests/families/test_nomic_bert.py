"""NomicBERT (``model_type: nomic_bert``), what only this family does: classification losses (multi-label,
regression) and the default rope base when config.json leaves it out, the published checkpoints' config.json in
Nomic's own format (loaded, padded vocabulary, switches transformers lacks refused, saved in transformers' format),
the config.json mapping, a fused QKV tensor of the wrong size, and a sequence classifier from a backbone checkpoint
(no pooler). Parity of every head, the padded and packed paths, hidden states, attention probabilities, in-memory
checkpoint names, the errors, the tokenizer convention and the presets: the tables of ``test_parity.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import transformers

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.hf.weights import CheckpointError
from bertblocks.registry import BuildError

from .reference import FAMILIES, assert_same, batch, round_trip, save_hf

NOMIC = FAMILIES["nomic_bert"]


def test_multi_label_sequence_classification_loss_as_transformers(tmp_path):
    cls = "NomicBertForSequenceClassification"
    inputs, mask = batch(NOMIC, cls)
    inputs["labels"] = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    round_trip(tmp_path, NOMIC, cls, inputs, mask)


def test_regression_loss_and_default_rope_base(tmp_path):
    cls = "NomicBertForSequenceClassification"
    inputs, mask = batch(NOMIC, cls)
    inputs["labels"] = torch.tensor([0.5, -1.0])
    # NomicBertConfig's own rope default (θ = 1000), read when config.json leaves it out
    round_trip(tmp_path, NOMIC, cls, inputs, mask, num_labels=1, rope_parameters=None)


#: the shape of the published checkpoints' config.json (Nomic's remote-code format, nomic-embed-text-v1.5's fields),
#: at the test's tiny sizes
ORIGINAL: dict[str, Any] = {
    "model_type": "nomic_bert",
    "architectures": ["NomicBertModel"],
    "activation_function": "swiglu",
    "attn_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "causal": False,
    "dense_seq_output": True,
    "fused_bias_fc": True,
    "fused_dropout_add_ln": True,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-5,
    "max_trained_positions": 2048,
    "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
    "n_embd": 32,
    "n_head": 4,
    "n_inner": 37,
    "n_layer": 2,
    "n_positions": 64,
    "pad_vocab_size_multiple": 1,
    "parallel_block": False,
    "parallel_block_tied_norm": False,
    "prenorm": False,
    "qkv_proj_bias": False,
    "rotary_emb_base": 50,
    "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False,
    "rotary_emb_scale_base": None,
    "rotary_scaling_factor": None,
    "type_vocab_size": 2,
    "use_flash_attn": True,
    "use_rms_norm": False,
    "use_xentropy": True,
    "vocab_size": 99,
}


def test_nomic_original_config_json_loads_and_saves_as_transformers_format(tmp_path):
    reference = save_hf(NOMIC, "NomicBertModel", tmp_path / "published")
    # the published checkpoints: weights under the names transformers writes, config.json in Nomic's own format
    (tmp_path / "published" / "config.json").write_text(json.dumps(ORIGINAL))
    inputs, mask = batch(NOMIC, "NomicBertModel")
    ours, info = bertblocks.from_pretrained(tmp_path / "published", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        expected = reference(**inputs)
        assert_same(expected, ours.eval()(**inputs), mask)
    ours.save_pretrained(tmp_path / "converted")  # now a config.json transformers' NomicBertConfig reads
    written = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert "n_embd" not in written
    assert "bertblocks" not in written
    again = transformers.NomicBertModel.from_pretrained(tmp_path / "converted").eval()
    with torch.no_grad():
        assert_same(expected, again(**inputs), mask)


def test_nomic_original_vocabulary_is_padded_to_its_multiple():
    cfg = bertblocks.load_config(config_from_hf({**ORIGINAL, "vocab_size": 30522, "pad_vocab_size_multiple": 64}))
    assert cfg.vocab_size == 30528


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"qkv_proj_bias": True}, "qkv_proj_bias is True"),
        ({"prenorm": True}, "prenorm is True"),
        ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction is 0.5"),
        ({"rotary_scaling_factor": 2.0}, "rotary_scaling_factor is 2.0"),
        ({"activation_function": "gelu"}, "activation_function is 'gelu'"),
    ],
)
def test_nomic_original_switches_transformers_lacks_are_errors(change, message):
    with pytest.raises(ConfigError, match=message):
        bertblocks.load_config(config_from_hf({**ORIGINAL, **change}))


def test_config_maps_to_the_components_it_is_made_of():
    cfg = bertblocks.load_config(config_from_hf(NOMIC.hf_config()))
    assert cfg.position.name == "rope"
    assert cfg.position.options()["base"] == 50.0
    assert cfg.encoder.attention.changed_options() == {"qkv_bias": False, "output_bias": False, "fused_qkv": True}
    assert cfg.encoder.feedforward.name == "glu"
    assert cfg.encoder.feedforward.activation == "silu"
    assert cfg.encoder.feedforward.options()["bias"] is False
    assert cfg.pooler is None  # NomicBertModel has none
    back = config_to_hf(cfg)
    assert back["rope_parameters"] == {"rope_theta": 50.0, "rope_type": "default"}
    assert back["head_dim"] == 8
    assert "bertblocks" not in back


def test_fused_qkv_of_the_wrong_size_is_an_error_naming_it(tmp_path):
    from safetensors.torch import load_file, save_file

    save_hf(NOMIC, "NomicBertModel", tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    key = "encoder.layers.1.attn.Wqkv.weight"
    state[key] = state[key][:64]  # two of the three parts
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="Wqkv"):
        bertblocks.from_pretrained(tmp_path)


def test_sequence_classifier_from_a_backbone_checkpoint_asks_for_the_pooler(tmp_path):
    save_hf(NOMIC, "NomicBertModel", tmp_path)
    with pytest.raises(BuildError, match="pooler: null"):
        bertblocks.from_pretrained(tmp_path, head="sequence_classification")
    # with the pooler asked for, it builds (pooler and classifier start from the initialiser, as in transformers)
    model = bertblocks.from_pretrained(tmp_path, ["pooler=first_token"], head="sequence_classification")
    assert model.bert.pooler is not None
