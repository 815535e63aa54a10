"""A third-party family written only from the docs: the code of "Writing a family" in
docs/plugins/writing-a-plugin.md, run as it stands, registered through the plugin API as a third party would, loads
and saves a BERT-shaped ``config.json`` through the public helper (:mod:`bertblocks.families.bertlike`), and its
checkpoints under its own prefix."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.hf.weights import read_state_dict
from bertblocks.registry import Registry, set_registry

PAGE = Path(__file__).parents[2] / "docs" / "plugins" / "writing-a-plugin.md"
#: a BERT-shaped config.json of the docs' family: no type_vocab_size and no layer_norm_eps (the family's
#: defaults: 0 and 1e-6), a field bertblocks does not model (kept through the `hf` passthrough)
CONFIG_JSON: dict[str, Any] = {
    "model_type": "mybert",
    "architectures": ["MyBertForSequenceClassification"],
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "hidden_act": "gelu_new",
    "id2label": {"0": "a", "1": "b", "2": "c"},
    "label2id": {"a": 0, "b": 1, "c": 2},
    "add_pooling_layer": True,
    "summary_note": "kept for the round trip",
}


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text.split("\n## Writing a family\n", 1)[1].split("\n## ", 1)[0]


def _plugin() -> types.ModuleType:
    """The section's Python code as a module, as a plugin package would hold it."""
    blocks = re.findall(r"^```python\n(.*?)^```", _section(), flags=re.S | re.M)
    assert len(blocks) == 1, "the section shows one complete family"
    module = types.ModuleType("mybert_plugin")
    exec(compile(blocks[0], f"{PAGE.name}: Writing a family", "exec"), module.__dict__)
    return module


@pytest.fixture
def registry() -> Registry:
    """The built-ins and the docs' family, registered as an in-process plugin (conftest resets the registry)."""
    registry = Registry(load_entry_points=False)
    registry.register(_plugin(), name="mybert")
    set_registry(registry)
    return registry


def test_the_docs_family_uses_only_the_public_api():
    code = re.findall(r"^```python\n(.*?)^```", _section(), flags=re.S | re.M)[0]
    imported = re.findall(r"^from (bertblocks[\w.]*) import", code, flags=re.M)
    assert "bertblocks.families.bertlike" in imported
    assert not [name for name in imported if any(part.startswith("_") for part in name.split("."))]


def test_the_docs_family_loads_and_saves_a_bert_shaped_config_json(tmp_path, registry):
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(CONFIG_JSON))
    config = bertblocks.load_config(source / "config.json")
    assert config.family == "mybert"
    assert (config.hidden_size, config.encoder.num_layers, config.encoder.attention.num_heads) == (32, 2, 4)
    assert config.encoder.feedforward.intermediate_size == 37
    assert config.encoder.feedforward.activation == "gelu_new"
    assert (config.type_vocab_size, config.layer_norm_eps) == (0, 1e-6)  # the family's defaults
    assert config.head is not None
    assert config.head.name == "sequence_classification"  # from `architectures`
    assert config.num_labels == 3
    assert config.pooler is not None
    assert config.hf == {"summary_note": "kept for the round trip"}  # the passthrough, nothing else

    torch.manual_seed(0)
    model = bertblocks.create_model(config).eval()
    assert not any("token_type" in key for key in model.state_dict())  # type_vocab_size 0: no table
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        assert torch.equal(logits, model(input_ids=ids, token_type_ids=torch.ones_like(ids)).logits)  # ignored

    model.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    for key, value in CONFIG_JSON.items():
        assert written[key] == value, key
    assert (written["type_vocab_size"], written["layer_norm_eps"], written["use_alibi"]) == (0, 1e-6, False)
    assert "position_embedding_type" not in written  # dropped: the family has no such field
    assert "bertblocks" not in written  # the family's own fields say everything
    keys = read_state_dict([tmp_path / "saved" / "model.safetensors"])
    assert "mybert.encoder.layer.1.attention.self.query.weight" in keys  # the family's prefix
    assert "classifier.weight" in keys

    again = bertblocks.from_pretrained(tmp_path / "saved", head="auto").eval()
    # the same config; saving records the weights' dtype in the passthrough, as transformers writes it
    assert again.config.hf == {**config.hf, "dtype": "float32", "torch_dtype": "float32"}
    assert {**again.config.model_dump(), "hf": {}} == {**config.model_dump(), "hf": {}}
    with torch.no_grad():  # the same modules and weights through the family's format
        assert torch.equal(again(input_ids=ids).logits, logits)


def test_a_backbone_without_pooler_round_trips(tmp_path, registry):
    hf = {**CONFIG_JSON, "architectures": ["MyBertModel"], "add_pooling_layer": False}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    config = bertblocks.load_config(tmp_path / "config.json")
    assert config.pooler is None
    assert config.head is None
    bertblocks.create_model(config).save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert (written["architectures"], written["add_pooling_layer"]) == (["MyBertModel"], False)
    assert not any(key.startswith("pooler.") for key in read_state_dict([tmp_path / "saved" / "model.safetensors"]))


def test_the_docs_family_passes_the_conformance_suite(registry):
    from bertblocks.testing import ConformanceSuite

    results = ConformanceSuite(registry).run(kinds=["family"], provider="mybert")
    assert results == {"family-mybert-family_round_trip": "ok"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_alibi": True}, r"mybert: use_alibi=true is not supported"),
        ({"bertblocks": {"position": {"name": "relative_key"}}}, r"position\.name.*requires 'absolute'"),
    ],
)
def test_what_the_docs_family_cannot_represent_is_an_error_naming_the_field(tmp_path, registry, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG_JSON, **change}))
    with pytest.raises(ConfigError, match=message):
        bertblocks.load_config(tmp_path / "config.json")
