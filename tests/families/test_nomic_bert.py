"""NomicBERT (``model_type: nomic_bert``): tiny random checkpoints saved by transformers 5.23's own classes load
with ``from_pretrained(dir, head="auto")`` and give the same numbers on a padded batch (real tokens, losses
included); saved by bertblocks, the same class loads them with no missing or unexpected keys and the same
numbers. Plus the config.json translation, its errors, the tokenizer convention and the presets."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import bertblocks
from bertblocks import BertTokenizer
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.hf.weights import CheckpointError
from bertblocks.registry import BuildError

from .test_presets import FAMILY_PRESETS
from .test_tokenizers import PAIRS, TEXTS, save, wordpiece

TOL = 1e-5
B, L = 2, 9
SETTINGS: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,  # sharp attention: a wrong rotation or mask shows in the numbers
    "layer_norm_eps": 1e-5,
    # a base far from the default 1000, so that a rope base read wrongly (or not at all) changes the numbers
    "rope_parameters": {"rope_theta": 50.0, "rope_type": "default"},
    "num_labels": 3,
}
CLASSES = (
    "NomicBertModel",
    "NomicBertForMaskedLM",
    "NomicBertForSequenceClassification",
    "NomicBertForTokenClassification",
)
FIELDS = ("loss", "last_hidden_state", "pooler_output", "logits")


def save_hf(cls: str, directory: Path, **extra: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.NomicBertConfig(**{**SETTINGS, **extra})
    model = getattr(transformers, cls)(config).eval()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(directory)
    return model


def batch(cls: str, labels: str = "long") -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Right padding in the second row, token types 0/1, labels of the head's kind; the real-token mask."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 99, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, 5:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    types = torch.zeros(B, L, dtype=torch.long)
    types[:, 3:] = 1  # the second segment: the token-type table is read
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if cls.endswith("MaskedLM"):
        inputs["labels"] = torch.randint(0, 99, (B, L), generator=g).masked_fill(mask == 0, -100)
    elif cls.endswith("SequenceClassification"):
        inputs["labels"] = {
            "long": torch.tensor([0, 2]),
            "multi": torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
        }[labels]
    elif cls.endswith("TokenClassification"):
        inputs["labels"] = torch.randint(0, 3, (B, L), generator=g).masked_fill(mask == 0, -100)
    return inputs, mask


def max_diff(theirs: Any, ours: Any, mask: torch.Tensor) -> float:
    """The largest difference over the fields transformers returns (per-token fields on real tokens only)."""
    worst, compared = 0.0, 0
    for name in FIELDS:
        a = getattr(theirs, name, None)
        if a is None:
            continue
        b = getattr(ours, name, None)
        assert b is not None, f"bertblocks returned no {name}"
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.dim() >= 2 and a.shape[:2] == mask.shape:
            a, b = a[mask.bool()], b[mask.bool()]
        worst = max(worst, (a - b).abs().max().item())
        compared += 1
    assert compared >= 1
    return worst


def roundtrip(tmp_path: Path, cls: str, inputs: dict[str, torch.Tensor], mask: torch.Tensor, **extra: Any) -> None:
    reference = save_hf(cls, tmp_path / "hf", **extra)
    ours, info = bertblocks.from_pretrained(tmp_path / "hf", head="auto", output_loading_info=True)
    ours.eval()
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        expected = reference(**inputs)
        got = ours(**inputs)
    assert max_diff(expected, got, mask) <= TOL

    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "nomic_bert"
    assert written["architectures"] == [cls]
    assert "bertblocks" not in written  # the family's own fields say everything
    again, hf_info = getattr(transformers, cls).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not hf_info["missing_keys"]
    assert not hf_info["unexpected_keys"]
    assert not hf_info["mismatched_keys"]
    with torch.no_grad():
        assert max_diff(expected, again.eval()(**inputs), mask) <= TOL


@pytest.mark.parametrize("cls", CLASSES)
def test_loads_transformers_checkpoint_and_saves_one_it_loads(tmp_path, cls):
    inputs, mask = batch(cls)
    if cls.endswith("Model"):
        inputs.pop("labels", None)
    roundtrip(tmp_path, cls, inputs, mask)


def test_multi_label_sequence_classification_loss_as_transformers(tmp_path):
    inputs, mask = batch("NomicBertForSequenceClassification", labels="multi")
    roundtrip(tmp_path, "NomicBertForSequenceClassification", inputs, mask)


def test_regression_loss_and_default_rope_base(tmp_path):
    cls = "NomicBertForSequenceClassification"
    inputs, mask = batch(cls)
    inputs["labels"] = torch.tensor([0.5, -1.0])
    # NomicBertConfig's own rope default (θ = 1000), read when config.json leaves it out
    roundtrip(tmp_path, cls, inputs, mask, num_labels=1, rope_parameters=None)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("packing", ["never", "always"])
def test_padded_and_packed_paths_agree_with_transformers(tmp_path, packing, side):
    reference = save_hf("NomicBertModel", tmp_path)
    inputs, mask = batch("NomicBertModel")
    inputs.pop("labels", None)
    if side == "left":
        # transformers counts positions 0, 1, … over the padding too; packed, bertblocks restarts them at each
        # sequence's first real token: RoPE scores depend on position differences only, so the numbers agree
        mask = mask.flip(1)
        ids = torch.randint(3, 99, mask.shape, generator=torch.Generator().manual_seed(2)).masked_fill(mask == 0, 0)
        inputs = {**inputs, "attention_mask": mask, "input_ids": ids}
    ours = bertblocks.from_pretrained(tmp_path, [f"encoder.packing={packing}"]).eval()
    with torch.no_grad():
        assert max_diff(reference(**inputs), ours(**inputs), mask) <= TOL


def test_hidden_states_and_attention_probabilities_equal_transformers(tmp_path):
    save_hf("NomicBertForSequenceClassification", tmp_path)
    reference = transformers.NomicBertForSequenceClassification.from_pretrained(
        tmp_path, attn_implementation="eager"
    ).eval()
    inputs, mask = batch("NomicBertForSequenceClassification")
    ours = bertblocks.from_pretrained(tmp_path, ["encoder.attention.backend=eager"], head="auto").eval()
    with torch.no_grad():
        theirs = reference(**inputs, output_hidden_states=True, output_attentions=True)
        got = ours(**inputs, output_hidden_states=True, output_attentions=True)
    assert len(got.hidden_states) == len(theirs.hidden_states) == SETTINGS["num_hidden_layers"] + 1
    for a, b in zip(theirs.hidden_states, got.hidden_states, strict=True):
        assert (a - b)[mask.bool()].abs().max() <= TOL
    assert len(got.attentions) == len(theirs.attentions) == SETTINGS["num_hidden_layers"]
    for a, b in zip(theirs.attentions, got.attentions, strict=True):  # [b, h, q, k]; rows of real queries
        assert (a - b).transpose(1, 2)[mask.bool()].abs().max() <= TOL


def test_checkpoint_under_transformers_in_memory_names_loads(tmp_path):
    reference = save_hf("NomicBertForMaskedLM", tmp_path / "original")
    reference.save_pretrained(tmp_path, save_original_format=False)  # q_proj/k_proj/v_proj, … as in memory
    from safetensors.torch import load_file

    assert "nomic_bert.layers.0.self_attn.q_proj.weight" in load_file(tmp_path / "model.safetensors")
    inputs, mask = batch("NomicBertForMaskedLM")
    ours, info = bertblocks.from_pretrained(tmp_path, head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        assert max_diff(reference(**inputs), ours.eval()(**inputs), mask) <= TOL


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
    reference = save_hf("NomicBertModel", tmp_path / "published")
    # the published checkpoints: weights under the names transformers writes, config.json in Nomic's own format
    (tmp_path / "published" / "config.json").write_text(json.dumps(ORIGINAL))
    inputs, mask = batch("NomicBertModel")
    ours, info = bertblocks.from_pretrained(tmp_path / "published", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        expected = reference(**inputs)
        assert max_diff(expected, ours.eval()(**inputs), mask) <= TOL
    ours.save_pretrained(tmp_path / "converted")  # now a config.json transformers' NomicBertConfig reads
    written = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert "n_embd" not in written
    assert "bertblocks" not in written
    again = transformers.NomicBertModel.from_pretrained(tmp_path / "converted").eval()
    with torch.no_grad():
        assert max_diff(expected, again(**inputs), mask) <= TOL


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
    hf = transformers.NomicBertConfig(**SETTINGS).to_dict()
    cfg = bertblocks.load_config(config_from_hf(hf))
    assert cfg.position.name == "rope"
    assert cfg.position.options()["base"] == 50.0
    assert cfg.encoder.attention.options() == {"qkv_bias": False, "output_bias": False, "fused_qkv": True}
    assert cfg.encoder.feedforward.name == "glu"
    assert cfg.encoder.feedforward.activation == "silu"
    assert cfg.encoder.feedforward.options()["bias"] is False
    assert cfg.pooler is None  # NomicBertModel has none
    back = config_to_hf(cfg)
    assert back["rope_parameters"] == {"rope_theta": 50.0, "rope_type": "default"}
    assert back["head_dim"] == 8
    assert "bertblocks" not in back


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_parameters": {"rope_theta": 10.0, "rope_type": "linear", "factor": 2.0}}, "rope_type is 'linear'"),
        ({"head_dim": 16}, "head_dim 16"),
        ({"bertblocks": {"encoder": {"attention": {"fused_qkv": False}}}}, "encoder.attention.fused_qkv"),
        ({"bertblocks": {"position": {"name": "absolute"}}}, "position.name"),
    ],
)
def test_config_json_the_family_cannot_represent_is_an_error(change, message):
    hf = {**transformers.NomicBertConfig(**SETTINGS).to_dict(), **change}
    with pytest.raises(ConfigError, match=message):
        bertblocks.load_config(config_from_hf(hf))


def test_fused_qkv_of_the_wrong_size_is_an_error_naming_it(tmp_path):
    from safetensors.torch import load_file, save_file

    save_hf("NomicBertModel", tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    key = "encoder.layers.1.attn.Wqkv.weight"
    state[key] = state[key][:64]  # two of the three parts
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="Wqkv"):
        bertblocks.from_pretrained(tmp_path)


def test_sequence_classifier_from_a_backbone_checkpoint_asks_for_the_pooler(tmp_path):
    save_hf("NomicBertModel", tmp_path)
    with pytest.raises(BuildError, match="pooler: null"):
        bertblocks.from_pretrained(tmp_path, head="sequence_classification")
    # with the pooler asked for, it builds (pooler and classifier start from the initialiser, as in transformers)
    model = bertblocks.from_pretrained(tmp_path, ["pooler=first_token"], head="sequence_classification")
    assert model.bert.pooler is not None


def test_tokenizer_follows_bert_convention_as_transformers(tmp_path):
    tok = wordpiece()  # no post-processor: the family's template frames the texts
    directory = save(tmp_path, tok, "BertTokenizer")
    (directory / "config.json").write_text(json.dumps({"model_type": "nomic_bert"}))
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    for args in ((TEXTS,), (TEXTS, PAIRS)):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys())
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key


def test_presets_exist_and_are_checked_against_transformers():
    # tests/families/test_presets.py builds every family preset against transformers' own model
    assert {"nomic-bert-2048", "nomic-embed-text-v1.5"} <= set(FAMILY_PRESETS)
    assert bertblocks.load_config("nomic-bert-2048").family == "nomic_bert"
