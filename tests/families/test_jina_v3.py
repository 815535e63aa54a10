"""Jina-embeddings-v3 (``model_type: jina_embeddings_v3``): tiny random checkpoints saved by transformers 5.23's
own classes load with ``from_pretrained(dir, head="auto")`` and give the same numbers on a padded batch (real
tokens, losses included); saved by bertblocks, the same class loads them with no missing or unexpected keys and
the same numbers. Plus the config.json translation, its errors, the tokenizer convention and the preset."""

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

from .test_nomic_bert import max_diff
from .test_presets import FAMILY_PRESETS
from .test_tokenizers import PAIRS, TEXTS, save, unigram

TOL = 1e-5
B, L, PAD = 2, 9, 1
SETTINGS: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,  # sharp attention: a wrong rotation or mask shows in the numbers
    # a base far from the default 20000, so that a rope base read wrongly (or not at all) changes the numbers
    "rope_parameters": {"rope_theta": 30.0, "rope_type": "default"},
    "num_labels": 3,
}
CLASSES = (
    "JinaEmbeddingsV3Model",
    "JinaEmbeddingsV3ForMaskedLM",
    "JinaEmbeddingsV3ForSequenceClassification",
    "JinaEmbeddingsV3ForTokenClassification",
    "JinaEmbeddingsV3ForQuestionAnswering",
)


def save_hf(cls: str, directory: Path, **extra: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    settings = {**SETTINGS, **extra}
    if cls.endswith("QuestionAnswering"):
        settings["num_labels"] = 2  # start and end
    model = getattr(transformers, cls)(transformers.JinaEmbeddingsV3Config(**settings)).eval()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model.save_pretrained(directory)
    return model


def batch(cls: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Right padding in the second row (no token types: the XLM-R tokenizer returns none); labels of the head's
    kind; the real-token mask."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 99, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, 5:] = 0
    inputs = {"input_ids": ids.masked_fill(mask == 0, PAD), "attention_mask": mask}
    if cls.endswith("MaskedLM"):
        inputs["labels"] = torch.randint(0, 99, (B, L), generator=g).masked_fill(mask == 0, -100)
    elif cls.endswith("SequenceClassification"):
        inputs["labels"] = torch.tensor([0, 2])
    elif cls.endswith("TokenClassification"):
        inputs["labels"] = torch.randint(0, 3, (B, L), generator=g).masked_fill(mask == 0, -100)
    elif cls.endswith("QuestionAnswering"):
        inputs["start_positions"] = torch.tensor([1, 3])
        inputs["end_positions"] = torch.tensor([4, 20])  # out of range: clamped and ignored, as transformers
    return inputs, mask


@pytest.mark.parametrize("cls", CLASSES)
def test_loads_transformers_checkpoint_and_saves_one_it_loads(tmp_path, cls):
    reference = save_hf(cls, tmp_path / "hf")
    inputs, mask = batch(cls)
    ours, info = bertblocks.from_pretrained(tmp_path / "hf", head="auto", output_loading_info=True)
    ours.eval()
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        expected = reference(**inputs)
        got = ours(**inputs)
    assert max_diff(expected, got, mask) <= TOL
    if cls.endswith("QuestionAnswering"):
        assert (
            max(
                (expected.start_logits - got.start_logits).abs().max(),
                (expected.end_logits - got.end_logits).abs().max(),
            )
            <= TOL
        )

    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "jina_embeddings_v3"
    assert written["architectures"] == [cls]
    assert "bertblocks" not in written  # the family's own fields say everything
    again, hf_info = getattr(transformers, cls).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not hf_info["missing_keys"]
    assert not hf_info["unexpected_keys"]
    assert not hf_info["mismatched_keys"]
    with torch.no_grad():
        assert max_diff(expected, again.eval()(**inputs), mask) <= TOL


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("packing", ["never", "always"])
def test_padded_and_packed_paths_agree_with_transformers(tmp_path, packing, side):
    reference = save_hf("JinaEmbeddingsV3Model", tmp_path)
    inputs, mask = batch("JinaEmbeddingsV3Model")
    if side == "left":
        # transformers counts positions 0, 1, … over the padding too; packed, bertblocks restarts them at each
        # sequence's first real token: RoPE scores depend on position differences only, so the numbers agree
        mask = mask.flip(1)
        ids = torch.randint(3, 99, mask.shape, generator=torch.Generator().manual_seed(2)).masked_fill(mask == 0, PAD)
        inputs = {**inputs, "attention_mask": mask, "input_ids": ids}
    ours = bertblocks.from_pretrained(tmp_path, [f"encoder.packing={packing}"]).eval()
    with torch.no_grad():
        assert max_diff(reference(**inputs), ours(**inputs), mask) <= TOL


def test_hidden_states_and_attention_probabilities_equal_transformers(tmp_path):
    save_hf("JinaEmbeddingsV3ForMaskedLM", tmp_path)
    reference = transformers.JinaEmbeddingsV3ForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    inputs, mask = batch("JinaEmbeddingsV3ForMaskedLM")
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
    reference = save_hf("JinaEmbeddingsV3ForSequenceClassification", tmp_path / "original")
    reference.save_pretrained(tmp_path, save_original_format=False)  # q_proj/k_proj/v_proj, … as in memory
    from safetensors.torch import load_file

    assert "roberta.layers.0.self_attn.q_proj.bias" in load_file(tmp_path / "model.safetensors")
    inputs, mask = batch("JinaEmbeddingsV3ForSequenceClassification")
    ours, info = bertblocks.from_pretrained(tmp_path, head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    with torch.no_grad():
        assert max_diff(reference(**inputs), ours.eval()(**inputs), mask) <= TOL


def test_config_maps_to_the_components_it_is_made_of():
    hf = transformers.JinaEmbeddingsV3Config(**SETTINGS).to_dict()
    cfg = bertblocks.load_config(config_from_hf(hf))
    assert cfg.position.name == "rope"
    assert cfg.position.options()["base"] == 30.0
    assert cfg.embedding.options().get("position_offset", "none") == "none"  # no RoBERTa offset: 0, 1, 2, …
    assert cfg.encoder.attention.options()["fused_qkv"] is True
    assert cfg.encoder.feedforward.name == "bert"
    assert cfg.pooler is not None  # JinaEmbeddingsV3Model has one
    back = config_to_hf(cfg)
    assert back["rope_parameters"] == {"rope_theta": 30.0, "rope_type": "default"}
    assert "bertblocks" not in back


def test_class_defaults_fill_a_sparse_config_json():
    cfg = bertblocks.load_config(config_from_hf({"model_type": "jina_embeddings_v3"}))
    theirs = transformers.JinaEmbeddingsV3Config()
    assert cfg.vocab_size == theirs.vocab_size
    assert cfg.hidden_size == theirs.hidden_size
    assert cfg.encoder.num_layers == theirs.num_hidden_layers
    assert cfg.pad_token_id == theirs.pad_token_id
    assert cfg.layer_norm_eps == theirs.layer_norm_eps
    assert cfg.position.options()["base"] == theirs.rope_parameters["rope_theta"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_parameters": {"rope_theta": 10.0, "rope_type": "dynamic", "factor": 2.0}}, "rope_type is 'dynamic'"),
        ({"bertblocks": {"embedding": {"position_offset": "padding"}}}, "embedding.position_offset"),
        ({"bertblocks": {"encoder": {"feedforward": {"name": "glu"}}}}, "encoder.feedforward.name"),
    ],
)
def test_config_json_the_family_cannot_represent_is_an_error(change, message):
    hf = {**transformers.JinaEmbeddingsV3Config(**SETTINGS).to_dict(), **change}
    with pytest.raises(ConfigError, match=message):
        bertblocks.load_config(config_from_hf(hf))


def test_tokenizer_follows_xlm_roberta_convention_as_transformers(tmp_path):
    tok = unigram()  # no post-processor: the family's template frames the texts
    directory = save(tmp_path, tok, "XLMRobertaTokenizer")
    (directory / "config.json").write_text(json.dumps({"model_type": "jina_embeddings_v3"}))
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    for args in ((TEXTS,), (TEXTS, PAIRS)):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys())  # no token types, as XLM-R's tokenizer
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key
    assert ours.pad_token_id == theirs.pad_token_id


def test_preset_exists_and_is_checked_against_transformers():
    # tests/families/test_presets.py builds every family preset against transformers' own model
    assert "jina-embeddings-v3" in FAMILY_PRESETS
    assert bertblocks.load_config("jina-embeddings-v3").family == "jina_embeddings_v3"
