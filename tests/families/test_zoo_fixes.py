"""What using the zoo's families turned up (issue 22): every family's saved config.json loads in transformers;
HF's own bookkeeping (``_num_labels``) is no "unknown key"; ModernBERT writes transformers 4.x's fields too;
``tiny-*`` presets for every family, and shrinking a preset keeps its per-layer pattern (open layer ranges) or
says what to change; export takes the model's own inputs, quietly; a config.json naming remote-code classes
(Jina-embeddings-v2's ``auto_map``) is refused, never built as plain BERT, and nothing it names is imported.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import bertblocks
from bertblocks import cli
from bertblocks.config import ConfigError
from bertblocks.errors import BertBlocksError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.hf.misspelt_keys import UnknownConfigKeyWarning
from bertblocks.models.export import example_inputs, export_program, model_inputs
from tests.tolerances import assert_close

from .test_nomic_bert import ORIGINAL

#: the tiny preset of each family (a family added later ships its own)
TINY_PRESETS = {
    "bert": "tiny-bert",
    "roberta": "tiny-roberta",
    "xlm-roberta": "tiny-xlm-roberta",
    "camembert": "tiny-camembert",
    "electra": "tiny-electra",
    "distilbert": "tiny-distilbert",
    "albert": "tiny-albert",
    "mpnet": "tiny-mpnet",
    "ernie": "tiny-ernie",
    "modernbert": "tiny-modernbert",
    "nomic_bert": "tiny-nomic-bert",
    "jina_embeddings_v3": "tiny-jina-embeddings-v3",
    "deberta-v2": "tiny-deberta-v2",
    "gte": "tiny-gte",
    "roformer": "tiny-roformer",
    "esm": "tiny-esm",
    "jina_bert": "tiny-jina-v2",
    "eurobert": "tiny-eurobert",
    "neobert": "tiny-neobert",
    "roberta-prelayernorm": "tiny-roberta-prelayernorm",
    "megatron-bert": "tiny-megatron-bert",
    "xlm-roberta-xl": "tiny-xlm-roberta-xl",
    "data2vec-text": "tiny-data2vec-text",
    "deberta": "tiny-deberta",
    "longformer": "tiny-longformer",
    "layoutlm": "tiny-layoutlm",
    "xmod": "tiny-xmod",
    "bert-generation": "tiny-bert-generation",
    "mobilebert": "tiny-mobilebert",
}
#: families whose config.json names remote-code classes under another family's model_type: transformers reads it
#: as that family's plain model (wrong for the weights; see tests/families/test_jina_v2.py)
REMOTE_FORMAT = {"jina_bert": "bert"}
REPO = Path(__file__).resolve().parents[2]


def _hf_json(model: torch.nn.Module, folder: Path) -> dict[str, Any]:
    model.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


# ------------------------------------------------------------------------------------------ tiny presets
def test_every_family_has_a_tiny_preset_listed_by_the_cli(capsys):
    presets = set(bertblocks.list_presets())
    assert set(TINY_PRESETS.values()) <= presets
    for family, name in TINY_PRESETS.items():
        assert bertblocks.load_config(name).family == family
    assert cli.main(["presets", "tiny-*"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in TINY_PRESETS.values())


# ------------------------------------------------------------------- saved config.json loads in transformers
#: NeoBERT ships remote code only: transformers has no class to load it (tests/families/test_neobert.py compares it
#: with a reference of its equations instead)
@pytest.mark.parametrize(
    "name", sorted(n for f, n in TINY_PRESETS.items() if f not in REMOTE_FORMAT and f != "neobert")
)
def test_saved_config_of_every_family_loads_in_transformers(name, tmp_path):
    torch.manual_seed(0)
    model = bertblocks.create_model(name)
    _hf_json(model, tmp_path)
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert theirs.model_type == model.config.family
    assert theirs.hidden_size == model.config.hidden_size  # DistilBERT's dim through its attribute_map
    assert theirs.num_hidden_layers == model.config.encoder.num_layers
    # and transformers' model takes the weights: nothing missing, nothing left over
    _, info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info


def test_nomic_original_config_with_null_pad_token_id_saves_a_config_transformers_reads(tmp_path):
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "config.json").write_text(json.dumps({**ORIGINAL, "pad_token_id": None}))
    model = bertblocks.create_model(bertblocks.load_config(tmp_path / "published"))
    assert model.config.pad_token_id is None
    saved = _hf_json(model, tmp_path / "saved")
    assert "pad_token_id" not in saved  # NomicBertConfig types it as an int: null is refused
    assert saved["bertblocks"] == {"pad_token_id": None}  # bertblocks' own choice travels beside
    theirs = transformers.AutoConfig.from_pretrained(tmp_path / "saved")
    assert isinstance(theirs, transformers.NomicBertConfig)
    assert theirs.hidden_size == 32
    assert bertblocks.from_pretrained(tmp_path / "saved").config.pad_token_id is None


# ------------------------------------------------------------------------------------------- _num_labels
def test_num_labels_bookkeeping_of_older_transformers_is_no_unknown_key():
    old = {"model_type": "bert", "_num_labels": 2, "id2label": {"0": "NEG", "1": "POS"}, "hidden_size": 32}
    old |= {"num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 37, "vocab_size": 99}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownConfigKeyWarning)
        config = bertblocks.load_config(config_from_hf(old))
    assert config.num_labels == 2
    assert "_num_labels" not in config.hf
    assert "_num_labels" not in config_to_hf(config)
    # a real misspelling still warns
    with pytest.warns(UnknownConfigKeyWarning, match="num_lables"):
        config_from_hf({**old, "num_lables": 3})


# ------------------------------------------------------------------------------ ModernBERT's 4.x fields
def test_modernbert_writes_the_fields_transformers_4_reads(tmp_path):
    # not transformers' defaults (every third layer global, bases 160000 and 10000): a field left out shows
    overrides = {
        "encoder.num_layers": 5,
        "encoder.overrides.0.layers": "1-/2",
        "position.base": 1000.0,
        "encoder.overrides.0.position.base": 50.0,
    }
    model = bertblocks.create_model("tiny-modernbert", overrides=overrides)
    saved = _hf_json(model, tmp_path)
    full_, local = "full_attention", "sliding_attention"
    assert saved["layer_types"] == [full_, local, full_, local, full_]
    assert (saved["global_attn_every_n_layers"], saved["global_rope_theta"], saved["local_rope_theta"]) == (2, 1000, 50)
    assert saved["local_attention"] == 8
    # what a 4.x reader sees (no layer_types, no rope_parameters): transformers' class derives the same model
    older = {k: v for k, v in saved.items() if k not in ("layer_types", "rope_parameters", "bertblocks")}
    full = transformers.ModernBertConfig(**{k: v for k, v in saved.items() if k != "model_type"})
    legacy = transformers.ModernBertConfig(**{k: v for k, v in older.items() if k != "model_type"})
    assert legacy.layer_types == full.layer_types == saved["layer_types"]
    assert legacy.rope_parameters == full.rope_parameters
    assert bertblocks.load_config(config_from_hf(older)) == model.config


def test_modernbert_pattern_4x_cannot_say_writes_no_global_every_n(tmp_path):
    # layers 0 and 1 global, 2 local: no global_attn_every_n_layers gives it; a wrong one would mislead 4.x
    overrides = {"encoder.overrides.0.layers": [2]}
    saved = _hf_json(bertblocks.create_model("tiny-modernbert", overrides=overrides), tmp_path)
    assert saved["layer_types"] == ["full_attention", "full_attention", "sliding_attention"]
    assert "global_attn_every_n_layers" not in saved


# ------------------------------------------------------------------------------------ shrinking a preset
@pytest.mark.parametrize("num_layers", [1, 3, 4, 7])
def test_shrinking_modernbert_keeps_its_layer_pattern(num_layers):
    config = bertblocks.load_config("modernbert-base", overrides={"encoder.num_layers": num_layers})
    types = config_to_hf(config)["layer_types"]
    assert types == transformers.ModernBertConfig(num_hidden_layers=num_layers).layer_types


def test_a_closed_range_past_a_shrunk_stack_says_what_to_change():
    overrides = {"encoder.num_layers": 3, "encoder.overrides.0.layers": "1-21/3"}
    with pytest.raises(ConfigError) as info:
        bertblocks.load_config("modernbert-base", overrides=overrides)
    message = str(info.value)
    assert "encoder.overrides.0.layers: layers [4, 7, 10, 13, 16, 19] do not exist (num_layers is 3)" in message
    assert "end the range at layer 2" in message
    assert "'1-/3'" in message


def test_a_smaller_vocabulary_names_the_pad_token_id_to_set():
    with pytest.raises(ConfigError, match=r"pad_token_id: must be below vocab_size 99 \(it is 50283\).*pad_token_id=0"):
        bertblocks.load_config("modernbert-base", overrides={"vocab_size": 99})
    config = bertblocks.load_config("modernbert-base", overrides={"vocab_size": 99, "pad_token_id": 0})
    assert config.pad_token_id == 0


def test_open_ranges_follow_num_layers_and_a_range_past_the_stack_is_empty():
    base = {"hidden_size": 32, "encoder": {"attention": {"num_heads": 4}}}
    over = [{"layers": "2-", "attention": {"dropout": 0.5}}, {"layers": "1-/2", "attention": {"dropout": 0.3}}]
    config = bertblocks.load_config({**base, "encoder": {**base["encoder"], "num_layers": 6, "overrides": over}})
    assert [o.layers for o in config.encoder.overrides] == [[2, 3, 4, 5], [1, 3, 5]]
    shallow = bertblocks.load_config({**base, "encoder": {**base["encoder"], "num_layers": 2, "overrides": over}})
    assert [o.layers for o in shallow.encoder.overrides] == [[], [1]]


# ------------------------------------------------------------------------------------------------ export
@pytest.mark.parametrize(
    ("name", "token_types"),
    [("tiny-bert", True), ("tiny-modernbert", False), ("tiny-distilbert", False), ("tiny-mpnet", False)],
)
def test_export_takes_the_model_inputs_and_equals_eager(name, token_types):
    torch.manual_seed(0)
    model = bertblocks.create_model(name).eval()
    expected = ("input_ids", "attention_mask", "token_type_ids") if token_types else ("input_ids", "attention_mask")
    assert model_inputs(model) == expected
    program = export_program(model)
    # shorter than ModernBERT's window (the band covers every key) and longer than it
    for length in (3, 21):
        inputs = example_inputs(model, batch=3, length=length)
        with torch.no_grad():
            got, want = program.module()(**inputs), model(**inputs)
        mask = inputs["attention_mask"].bool()
        assert_close(got.last_hidden_state[mask], want.last_hidden_state[mask])


def test_export_command_on_a_model_without_token_types_is_quiet(tmp_path):
    torch.manual_seed(0)
    bertblocks.create_model("tiny-modernbert").save_pretrained(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "bertblocks.cli", "export", str(tmp_path / "ckpt"), str(tmp_path / "m.onnx")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert "inputs input_ids, attention_mask;" in done.stdout
    assert done.stderr.strip() == ""  # no torchvision registration, pytree deprecation or axis-name notices
    assert (tmp_path / "m.onnx").stat().st_size > 0


# --------------------------------------------------------------------------- remote-code classes (auto_map)
#: Jina-embeddings-v2 as published: model_type bert, its own classes (ALiBi, a gated MLP) named by auto_map
JINA_V2: dict[str, Any] = {
    "model_type": "bert",
    "architectures": ["JinaBertForMaskedLM"],
    "auto_map": {
        "AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
        "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel",
        "AutoModelForMaskedLM": "jinaai/jina-bert-implementation--modeling_bert.JinaBertForMaskedLM",
    },
    "position_embedding_type": "alibi",
    "feed_forward_type": "geglu",
    "emb_pooler": "mean",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 37,
    "vocab_size": 99,
    "max_position_embeddings": 64,
}


def test_config_naming_remote_classes_is_refused_and_nothing_is_imported(tmp_path):
    folder = tmp_path / "jina-v2"
    folder.mkdir()
    local_map = {"AutoConfig": "configuration_bert.JinaBertConfig", "AutoModel": "modeling_bert.JinaBertModel"}
    (folder / "config.json").write_text(json.dumps({**JINA_V2, "auto_map": local_map}))
    marker = tmp_path / "imported"
    for module in ("configuration_bert", "modeling_bert"):
        (folder / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(ConfigError) as info:
        bertblocks.from_pretrained(folder)
    assert isinstance(info.value, BertBlocksError)
    message = str(info.value)
    assert "auto_map: names remote-code classes (configuration_bert.JinaBertConfig, modeling_bert.JinaBertModel)" in (
        message
    )
    assert "remove auto_map" in message
    assert not marker.exists()
    # the published classes are translated by the jina_bert family (tests/families/test_jina_v2.py); another
    # repository's classes under the same model_type stay refused
    assert bertblocks.load_config(JINA_V2).family == "jina_bert"
    other = {
        k: v.replace("jina-bert-implementation", "jina-bert-v2-qk-post-norm") for k, v in JINA_V2["auto_map"].items()
    }
    named = re.escape("jinaai/jina-bert-v2-qk-post-norm--modeling_bert.JinaBertForMaskedLM")
    with pytest.raises(ConfigError, match=named):
        bertblocks.load_config({**JINA_V2, "auto_map": other})


def test_a_family_that_translates_the_remote_format_still_reads_it():
    # NomicBERT's original config.json carries an auto_map too; the family translates it field by field
    remote = {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig"}
    config = bertblocks.load_config(config_from_hf({**ORIGINAL, "auto_map": remote}))
    assert config.hidden_size == 32
    assert "auto_map" not in config.hf
    # but transformers' own NomicBERT format with an auto_map is refused
    native = config_to_hf(config)
    with pytest.raises(ConfigError, match="auto_map: names remote-code classes"):
        config_from_hf({**native, "auto_map": remote})
