"""Config: YAML and HF config.json round trips, per-layer and dotted overrides, and located errors."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from torch import nn

import bertblocks
from bertblocks import BertConfig, load_config, save_config
from bertblocks.config import ConfigError
from bertblocks.config_files import dump_yaml
from bertblocks.core.interfaces import Positions
from bertblocks.families.family import Family
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.plugins.backends import EagerBackend, SdpaBackend
from tests.conftest import TINY, TINY_HF, V4, batch, max_diff
from tests.tolerances import assert_close

# A config exercising every kind of value: nested components, plugin shorthand, an override, labels.
YAML_TEXT = """\
# tiny relative-position BERT for the round-trip test
vocab_size: 99
hidden_size: 32
max_position_embeddings: 64
layer_norm_eps: 1.0e-7
position: relative_key_query
encoder:
  num_layers: 3
  attention:
    num_heads: 4
    dropout: 0.2
    backend: eager
  feedforward: {intermediate_size: 37, activation: gelu_new}
  chunk_size_feed_forward: 4
  overrides:
    - layers: "1-2"
      attention: {backend: sdpa}
    - layers: [0]
      feedforward: {activation: relu}
pooler: mean
id2label: {0: neg, 1: pos, 2: neutral}
problem_type: single_label_classification
pruned_heads: {1: [0, 3]}
"""


def _tiny(**changes: object) -> dict:
    data = copy.deepcopy(TINY)
    data.update(changes)
    return data


def _error(source: object, overrides: object = ()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)  # type: ignore[arg-type]
    return info.value


def _messages(error: ConfigError) -> list[str]:
    return [str(issue) for issue in error.issues]


# ------------------------------------------------------------------------------------------------ YAML
def test_yaml_file_dump_and_load_again_is_equal(tmp_path: Path):
    path = tmp_path / "model.yaml"
    path.write_text(YAML_TEXT)
    config = load_config(path)
    # what the file says arrived where it belongs (so equality below is not equality of two defaults)
    assert config.position.name == "relative_key_query"
    assert config.encoder.attention.backend.name == "eager"
    assert config.encoder.attention.dropout == 0.2
    assert config.encoder.overrides[0].layers == [1, 2]
    assert config.pooler is not None
    assert config.pooler.name == "mean"
    assert config.id2label == {0: "neg", 1: "pos", 2: "neutral"}
    assert config.num_labels == 3
    assert config.pruned_heads == {1: [0, 3]}
    assert config.layer_norm_eps == 1e-7

    again = tmp_path / "again.yaml"
    again.write_text(dump_yaml(config))
    assert load_config(again) == config
    save_config(config, tmp_path / "saved.yml")
    assert load_config(tmp_path / "saved.yml") == config


def test_dumped_yaml_writes_every_field():
    text = dump_yaml(load_config(TINY))
    for key in ("vocab_size", "layer_norm_eps", "num_heads", "intermediate_size", "backend", "activation"):
        assert f"{key}:" in text


def test_load_config_never_changes_the_callers_dict():
    data = _tiny()
    before = copy.deepcopy(data)
    load_config(data, ["encoder.attention.backend=eager", "encoder.overrides.0.layers=1"])
    assert data == before


# --------------------------------------------------------------------------------------- HF config.json
# Attributes transformers reads to build (or describe) a BERT; each must survive config.json → ours → back.
HF_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "use_cache",
    "classifier_dropout",
    "is_decoder",
    "add_cross_attention",
    "tie_word_embeddings",
    "chunk_size_feed_forward",
    "num_labels",
    "id2label",
    "label2id",
    "problem_type",
    "architectures",
)


def _assert_same_hf(original: dict, written: dict) -> None:
    theirs = transformers.BertConfig(**original)
    ours = transformers.BertConfig(**json.loads(json.dumps(written)))  # through JSON, as on disk
    for name in HF_FIELDS:
        if name == "label2id" and theirs.label2id is None:
            # transformers 5 leaves label2id unset when only id2label is given; we write the inverse
            assert ours.label2id == {label: i for i, label in theirs.id2label.items()}
            continue
        assert getattr(ours, name, None) == getattr(theirs, name, None), name
    assert getattr(ours, "position_embedding_type", "absolute") == original.get("position_embedding_type", "absolute")


def test_transformers_5_config_round_trip():
    hf = transformers.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=8,
        intermediate_size=37,
        hidden_act="gelu_new",
        hidden_dropout_prob=0.05,
        attention_probs_dropout_prob=0.15,
        max_position_embeddings=40,
        type_vocab_size=3,
        layer_norm_eps=1e-6,
        pad_token_id=1,
        classifier_dropout=0.3,
        chunk_size_feed_forward=2,
        id2label={0: "neg", 1: "pos", 2: "neutral"},
        problem_type="multi_label_classification",
        is_decoder=True,
        add_cross_attention=True,
        use_cache=False,
        tie_word_embeddings=False,
        architectures=["BertForSequenceClassification"],
    ).to_dict()
    config = load_config(hf)
    assert config.encoder.num_layers == 3
    assert config.encoder.attention.num_heads == 8
    assert config.encoder.attention.dropout == 0.15
    assert config.encoder.feedforward.activation == "gelu_new"
    assert config.num_labels == 3
    assert config.label2id == {"neg": 0, "pos": 1, "neutral": 2}
    written = config_to_hf(config)
    _assert_same_hf(hf, written)
    assert load_config(json.loads(json.dumps(written))) == config


@pytest.mark.parametrize("case", sorted(p.name for p in V4.iterdir() if (p / "config.json").is_file()))
def test_transformers_4_config_round_trip(case: str):
    hf = json.loads((V4 / case / "config.json").read_text())
    config = load_config(hf)
    assert config.position.name == hf["position_embedding_type"]
    written = config_to_hf(config)
    _assert_same_hf(hf, written)
    assert written["position_embedding_type"] == hf["position_embedding_type"]
    assert load_config(json.loads(json.dumps(written))) == config


def test_pruned_heads_keys_are_ints_ours_and_strings_in_json():
    hf = json.loads((V4 / "pruned" / "config.json").read_text())
    assert hf["pruned_heads"] == {"0": [0, 2], "1": [3]}
    config = load_config(hf)
    assert config.pruned_heads == {0: [0, 2], 1: [3]}
    assert config_to_hf(config)["pruned_heads"] == hf["pruned_heads"]


def test_non_hf_choices_travel_under_the_bertblocks_key(tmp_path: Path):
    data = _tiny()
    data["position"] = "relative_key"
    data["pooler"] = "mean"
    data["encoder"]["overrides"] = [{"layers": "1", "attention": {"backend": "sdpa"}, "feedforward": "bert"}]
    config = load_config(data, ["encoder.attention.backend=eager", "encoder.feedforward.activation=silu"])
    written = config_to_hf(config)
    assert "bertblocks" in written
    assert written["position_embedding_type"] == "relative_key"  # HF-expressible: a plain HF field
    assert written["hidden_act"] == "silu"
    back = load_config(json.loads(json.dumps(written)))
    assert back == config
    assert back.encoder.attention.backend.name == "eager"
    assert back.encoder.overrides[0].layers == [1]

    # transformers keeps the key as an inert attribute and writes it back when it saves
    transformers.BertConfig(**written).save_pretrained(tmp_path)
    reloaded = load_config(tmp_path)
    assert reloaded.model_copy(update={"hf": {}}) == config.model_copy(update={"hf": {}})


def test_default_config_writes_no_bertblocks_key():
    assert "bertblocks" not in config_to_hf(load_config(TINY))


def test_model_type_no_family_handles_is_refused_listing_the_families():
    # roberta is a family now (tests/families); a model_type no plugin registers is still refused
    error = _error({"model_type": "gpt2", "num_hidden_layers": 2})
    (message,) = _messages(error)
    assert message.startswith("model_type: no model family handles 'gpt2'; families: ")
    assert "bert" in message
    assert "roberta" in message
    assert "distilbert" in message


# ------------------------------------------------------------------------------------ per-layer overrides
def test_per_layer_overrides_build_those_components_and_keep_the_numbers(hf_checkpoint):
    directory = hf_checkpoint(num_hidden_layers=3)
    base = bertblocks.from_pretrained(directory).eval()  # all sdpa, gelu
    mixed = bertblocks.from_pretrained(
        directory,
        {
            "encoder.overrides": [
                {"layers": "0-0", "attention": {"backend": "eager"}},
                {"layers": "1", "feedforward": {"activation": "relu"}},
            ]
        },
    ).eval()
    layers = mixed.encoder.layer
    assert type(layers[0].attention.backend) is EagerBackend
    assert type(layers[1].attention.backend) is SdpaBackend
    assert type(layers[2].attention.backend) is SdpaBackend
    assert type(layers[0].intermediate.intermediate_act_fn) is nn.GELU
    assert type(layers[1].intermediate.intermediate_act_fn) is nn.ReLU
    assert type(layers[2].intermediate.intermediate_act_fn) is nn.GELU

    inputs = batch()
    real = inputs["attention_mask"].bool()  # padded positions may be zeros (packed forward pass)
    with torch.no_grad():
        ours = mixed(**inputs, output_hidden_states=True)
        reference = base(**inputs, output_hidden_states=True)
        # layer 0 only changed its kernel: the same numbers as the all-sdpa model (fp32 rounding aside)
        assert_close(ours.hidden_states[1][real], reference.hidden_states[1][real])
        # layer 1 changed its activation: the numbers move, and equal the layer run by hand with relu
        assert max_diff(ours.hidden_states[2][real], reference.hidden_states[2][real]) > 1e-3
        manual = base.encoder.layer[1]
        manual.intermediate.intermediate_act_fn = nn.ReLU()
        mask = (1.0 - inputs["attention_mask"][:, None, None, :].float()) * torch.finfo(torch.float32).min
        expected = manual(reference.hidden_states[1], mask, Positions.contiguous(9, 0, torch.device("cpu")))[0]
    assert_close(ours.hidden_states[2][real], expected[real])


def test_override_that_names_another_backend_keeps_the_shared_fields():
    data = _tiny()
    data["encoder"]["attention"]["dropout"] = 0.3
    data["encoder"]["overrides"] = [{"layers": [1], "attention": {"backend": "eager"}}]
    config = load_config(data)
    attention, _ = config.encoder.layer_specs(1)
    assert attention.backend.name == "eager"
    assert attention.num_heads == 4
    assert attention.dropout == 0.3
    assert config.encoder.layer_specs(0)[0].backend.name == "sdpa"


# ---------------------------------------------------------------------------------------- dotted overrides
def test_dotted_overrides_parse_values_as_yaml():
    config = load_config(
        TINY,
        [
            "encoder.attention.backend=eager",  # shorthand for {name: eager}
            "hidden_dropout_prob=0.25",
            "pooler=null",
            "id2label={0: a, 1: b, 2: c}",
            "encoder.overrides=[{layers: '0-1', feedforward: {activation: relu}}]",
            "encoder.overrides.0.layers=1",  # list index into what the previous override set
        ],
    )
    assert config.encoder.attention.backend.name == "eager"
    assert config.hidden_dropout_prob == 0.25
    assert config.pooler is None
    assert config.num_labels == 3
    assert config.encoder.overrides[0].layers == [1]
    assert config.encoder.layer_specs(1)[1].activation == "relu"
    assert config.encoder.layer_specs(0)[1].activation == "gelu"


def test_dotted_overrides_can_start_a_list_item_and_take_a_mapping():
    config = load_config(TINY, ["encoder.overrides.0.layers=1", "encoder.overrides.0.attention.backend=eager"])
    assert config.encoder.layer_specs(1)[0].backend.name == "eager"
    config = load_config(TINY, {"encoder.num_layers": 3, "encoder.attention.num_heads": 8})
    assert (config.encoder.num_layers, config.encoder.attention.num_heads) == (3, 8)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("foo", "override 'foo' is not of the form dotted.key=value"),
        ("=3", "is not of the form dotted.key=value"),
        ("encoder.overrides.2.layers=1", "encoder.overrides.2: no item '2' in a list of 0"),
        ("encoder.num_layers.x=1", "encoder.num_layers: is a int, cannot set"),
    ],
)
def test_bad_dotted_overrides_are_config_errors(override: str, expected: str):
    assert expected in str(_error(TINY, [override]))


def test_overridden_values_are_validated_like_the_file():
    assert _messages(_error(TINY, ["encoder.attention.dropout=2.0"])) == [
        "encoder.attention.dropout: Input should be less than or equal to 1"
    ]


# ------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"hidden_size": -1}, "hidden_size: Input should be greater than 0"),
        ({"vocab_size": "many"}, "vocab_size: Input should be a valid integer"),
        ({"encoder.attention.dropout": 2.0}, "encoder.attention.dropout: Input should be less than or equal to 1"),
        ({"encoder.num_layers": 0}, "encoder.num_layers: Input should be greater than 0"),
        ({"layer_norm_eps": 0}, "layer_norm_eps: Input should be greater than 0"),
        ({"problem_type": "ranking"}, "problem_type: Input should be"),
        ({"encoder.attention.num_heads": 5}, "encoder.attention.num_heads: must divide hidden_size 32"),
        ({"pad_token_id": 99}, "pad_token_id: must be below vocab_size 99"),
        ({"hiden_size": 3}, "hiden_size: unknown field; allowed fields:"),
        ({"encoder.overrides": [{"layers": "3-4", "attention": "bert"}]}, "encoder.overrides.0.layers: layers [3, 4]"),
        ({"encoder.overrides": [{"layers": "x-y"}]}, "encoder.overrides.0.layers: cannot read layer range 'x-y'"),
        ({"pruned_heads": {0: [7]}}, "pruned_heads.0: heads [7] do not exist (the layer has 4 heads)"),
        ({"pruned_heads": {5: [0]}}, "pruned_heads.5: layer 5 does not exist (num_layers is 2)"),
        ({"pruned_heads": {0: [0, 1, 2, 3]}}, "pruned_heads.0: cannot prune all 4 heads"),
        ({"num_labels": 3, "id2label": {0: "a", 1: "b"}}, "num_labels: is 3 but id2label names 2 labels"),
        ({"id2label": {0: "a", 2: "b"}}, "id2label: keys must be 0..1"),
        ({"label2id": {"a": 0}}, "label2id: is not the inverse of id2label"),
    ],
)
def test_bad_values_are_reported_with_their_dotted_path(changes: dict, expected: str):
    messages = _messages(_error(TINY, changes))
    assert len(messages) == 1, messages
    assert messages[0].startswith(expected), messages


def test_unknown_component_lists_what_exists_and_the_closest():
    (message,) = _messages(_error(TINY, ["encoder.attention.backend=sdpaa"]))
    assert (
        message == "encoder.attention.backend: unknown backend 'sdpaa'; available: eager, sdpa, sliding_window "
        "(did you mean 'sdpa'?)"
    )
    (message,) = _messages(_error(TINY, ["position=relativ_key"]))
    assert message.startswith(
        "position: unknown position 'relativ_key'; available: absolute, disentangled, none, relative_bucket, "
        "relative_key,"
    )
    assert "(did you mean 'relative_key'?)" in message
    (message,) = _messages(
        _error(TINY, ["encoder.overrides.0.layers=1", "encoder.overrides.0.feedforward.activation=gelo"])
    )
    assert message.startswith("encoder.overrides.0.feedforward.activation: unknown activation 'gelo'; available: gelu,")
    assert "(did you mean 'gelu'?)" in message


def test_unknown_option_of_a_component_gets_a_did_you_mean():
    (message,) = _messages(_error(TINY, ["encoder.attention.backend.nmae=eager"]))
    assert (
        message
        == "encoder.attention.backend.nmae: unknown field; allowed fields: name, varlen_kernel (did you mean 'name'?)"
    )
    (message,) = _messages(_error(TINY, ["encoder.attention.num_head=3"]))
    assert message.startswith(
        "encoder.attention.num_head: unknown field; allowed fields: backend, dropout, fused_qkv, name,"
    )
    assert "(did you mean 'num_heads'?)" in message


def test_several_errors_are_reported_at_once():
    error = _error(
        TINY,
        [
            "encoder.attention.num_heads=5",
            "encoder.attention.backend=nope",
            "encoder.feedforward.activation=gelo",
            "position.bogus=1",
            "pruned_heads={9: [0]}",
        ],
    )
    locations = sorted(issue.loc for issue in error.issues)
    assert locations == [
        "encoder.attention.backend",
        "encoder.attention.num_heads",
        "encoder.feedforward.activation",
        "position.bogus",
        "pruned_heads.9",
    ]
    assert "(5 errors)" in str(error)
    # schema errors are collected together too
    assert sorted(i.loc for i in _error(TINY, {"hidden_size": "x", "vocab_size": 0}).issues) == [
        "hidden_size",
        "vocab_size",
    ]


def test_malformed_yaml_names_the_line(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("vocab_size: 99\nencoder:\n  num_layers: 2\n    attention: sdpa\n")
    error = _error(path)
    assert str(path) in str(error)
    (message,) = _messages(error)
    assert message.startswith("line 4, column 14: malformed YAML: mapping values are not allowed here")


def test_malformed_json_names_the_line(tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "bert",\n "vocab_size": }\n')
    (message,) = _messages(_error(path))
    assert message.startswith("line 2: not JSON (")


def test_top_level_must_be_a_mapping(tmp_path: Path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert _messages(_error(path)) == ["expected a mapping at the top, got list"]


def test_missing_file_is_file_not_found(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"config file not found: .*nope\.yaml"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_config(tmp_path)  # a directory without config.json


# ------------------------------------------------------------------------------ config.json: one translator
def _count_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every BertConfig validation from now on (model_validate and the constructor), counted."""
    count = [0]
    validate, init = BertConfig.model_validate.__func__, BertConfig.__init__  # type: ignore[attr-defined]

    def counted_validate(cls, *args, **kwargs):
        count[0] += 1
        return validate(cls, *args, **kwargs)

    def counted_init(self, *args, **kwargs):
        count[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(BertConfig, "model_validate", classmethod(counted_validate))
    monkeypatch.setattr(BertConfig, "__init__", counted_init)
    return count


@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert"])
def test_a_config_json_load_validates_as_often_as_any_config(tmp_path: Path, monkeypatch, model_type):
    # the translator validates nothing: the config.json is read into a dict and validated once, by the load,
    # as a YAML config is (before: dict → BertConfig → dict → BertConfig, and once more with the plugin defaults)
    cls = {"bert": transformers.BertConfig, "roberta": transformers.RobertaConfig}.get(model_type)
    sizes = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    if cls is None:
        hf = transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37).to_dict()
    else:
        hf = cls(**sizes, intermediate_size=37).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(hf))
    yaml_form = load_config(tmp_path).model_dump()
    count = _count_validations(monkeypatch)
    data = config_from_hf(hf)
    assert count[0] == 0
    from_json = load_config(tmp_path)
    per_json_load = count[0]
    count[0] = 0
    assert load_config(yaml_form) == from_json
    assert per_json_load == count[0] == 1
    assert data["family"] == model_type


def test_every_config_json_goes_through_one_translator_and_core_config_know_none():
    package = Path(bertblocks.__file__).parent
    below = "\n".join(p.read_text() for group in ("config", "core") for p in sorted((package / group).rglob("*.py")))
    # neither calls a translation nor keeps a slot for one (docstrings may point to it)
    assert re.findall(r"(?:from_hf|to_hf)\(|set_checkpoint_format|def from_hf|def to_hf", below) == []
    defined = [p.name for p in sorted((package / "hf").rglob("*.py")) if "def config_from_hf(" in p.read_text()]
    assert defined == ["config_json.py"]
    from bertblocks.families import FAMILY_PLUGINS

    for module in FAMILY_PLUGINS:  # each family (BERT too) registers its translation through the same path
        assert all(isinstance(c.factory(), Family) for c in module.bertblocks_register_components())


@pytest.mark.parametrize(
    ("hf", "location", "fields"),
    [
        (
            {"num_attention_heads": 4, "bertblocks": {"encoder": {"attention": {"num_heads": 8}}}},
            "bertblocks.encoder.attention.num_heads: is 8",
            "num_attention_heads is 4",
        ),
        (
            {"model_type": "distilbert", "n_heads": 4, "bertblocks": {"encoder": {"attention": {"num_heads": 8}}}},
            "bertblocks.encoder.attention.num_heads: is 8",
            "n_heads is 4",
        ),
        (
            {"position_embedding_type": "relative_key", "bertblocks": {"position": "absolute"}},
            "bertblocks.position.name: is 'absolute'",
            "position_embedding_type is 'relative_key'",
        ),
        (
            {"hidden_act": "gelu", "bertblocks": {"encoder": {"feedforward": {"activation": "relu"}}}},
            "bertblocks.encoder.feedforward.activation: is 'relu'",
            "hidden_act is 'gelu'",
        ),
    ],
    ids=["bert", "distilbert-names", "component-shorthand", "a-default-value"],
)
def test_a_bertblocks_block_contradicting_an_hf_field_is_refused_naming_both(hf, location, fields):
    (message,) = _messages(_error({**TINY_HF, **hf}))
    assert message.startswith(location)
    assert f"config.json's {fields}" in message


def test_a_bertblocks_block_may_add_what_hf_fields_cannot_say_and_repeat_what_they_do():
    block = {"encoder": {"attention": {"num_heads": 4, "backend": "eager"}}, "pooler": "mean"}
    config = load_config({**TINY_HF, "num_attention_heads": 4, "bertblocks": block})
    assert config.encoder.attention.num_heads == 4
    assert config.encoder.attention.backend.name == "eager"
    assert config.pooler is not None
    assert config.pooler.name == "mean"
    # what a family sets with no field saying so, the block may change (DistilBERT's single token type)
    distil = {"model_type": "distilbert", "dim": 32, "n_heads": 4, "n_layers": 2, "hidden_dim": 37, "vocab_size": 99}
    assert load_config({**distil, "bertblocks": {"type_vocab_size": 2}}).type_vocab_size == 2


def test_saving_never_writes_a_config_json_that_means_two_models():
    hf = transformers.ModernBertConfig(
        vocab_size=99, pad_token_id=0, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37
    ).to_dict()
    config = load_config(hf, ["encoder.attention.output_bias=true"])  # ModernBERT's one attention_bias says both
    with pytest.raises(ConfigError) as info:
        config_to_hf(config)
    assert "bertblocks.encoder.attention.output_bias: is True, but config.json's attention_bias is False" in str(
        info.value
    )
    hybrid = load_config(config, ["family=bertblocks-hybrid"])  # what the error suggests
    assert load_config(json.loads(json.dumps(config_to_hf(hybrid)))) == hybrid


def test_a_none_that_differs_from_the_family_travels():
    config = load_config(_tiny(pooler=None))
    assert config_to_hf(config)["bertblocks"] == {"pooler": None}
    assert load_config(config_to_hf(config)) == config


@pytest.mark.parametrize("block", [[1], "eager", None, 3])
def test_a_bertblocks_key_that_is_not_a_mapping_is_refused_at_load(block):
    (message,) = _messages(_error({**TINY_HF, "bertblocks": block}))
    assert message.startswith("bertblocks: must be a mapping of bertblocks' own choices")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # checked against BERT's declared config.json fields (bertblocks.families.bertlike.BERT_FIELDS), located at
        # the file's own key, before the family translates the file
        ({"hidden_size": True}, "hidden_size: hidden_size=True is not supported: it must be an integer ≥ 1"),
        ({"num_attention_heads": True}, "num_attention_heads: num_attention_heads=True is not supported: it must"),
        ({"num_hidden_layers": 2.0}, "num_hidden_layers: num_hidden_layers=2.0 is not supported: it must be"),
        ({"vocab_size": "99"}, "vocab_size: vocab_size='99' is not supported: it must be an integer ≥ 1, got the str"),
        ({"is_decoder": 1}, "is_decoder: is_decoder=1 is not supported: it must be a boolean (true or false), got the"),
        ({"layer_norm_eps": "1e-12"}, "layer_norm_eps: layer_norm_eps='1e-12' is not supported: it must be a"),
        ({"hidden_dropout_prob": False}, "hidden_dropout_prob: hidden_dropout_prob=False is not supported: it must be"),
    ],
)
def test_config_json_types_are_strict(change, expected):
    messages = _messages(_error({**TINY_HF, **change}))
    assert any(m.startswith(expected) for m in messages), messages


def test_yaml_types_are_strict_and_a_float_without_a_dot_is_a_float(tmp_path: Path):
    path = tmp_path / "model.yaml"
    path.write_text("vocab_size: 99\nhidden_size: 32\nlayer_norm_eps: 1e-5\nencoder: {attention: {num_heads: 4}}\n")
    assert load_config(path).layer_norm_eps == 1e-5  # YAML 1.2 reads a number, as every author means
    path.write_text("vocab_size: 99\nhidden_size: yes\n")
    (message,) = _messages(_error(path))
    assert message.startswith("hidden_size: Input should be a valid integer, got True")


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("hf:\n  created: 2020-01-01\n", "datetime.date(2020, 1, 1) at hf.created is a date, not a JSON value"),
        ("hf:\n  seen: !!set {a, b}\n", "at hf.seen is a set, not a JSON value"),
        ("hf:\n  blob: !!binary aGk=\n", "b'hi' at hf.blob is a bytes, not a JSON value"),
        ("encoder:\n  attention: {name: bert, when: 2020-01-01}\n", "at encoder.attention.when is a date"),
    ],
)
def test_non_json_values_are_refused_at_load_not_at_save(tmp_path: Path, yaml_text, expected):
    path = tmp_path / "model.yaml"
    path.write_text(yaml_text)
    (message,) = _messages(_error(path))
    assert expected in message


def test_non_json_values_are_refused_in_a_config_json_dict_and_in_the_schema():
    import datetime

    with pytest.raises(ConfigError, match="at when is a date, not a JSON value"):
        config_from_hf({**TINY_HF, "when": datetime.date(2020, 1, 1)})
    with pytest.raises(ConfigError, match="hf: nan at x is not a JSON number"):
        load_config({**TINY, "hf": {"x": float("nan")}})
    with pytest.raises(ValueError, match="at x is a date"):
        BertConfig(hf={"x": datetime.date(2020, 1, 1)})


@pytest.mark.parametrize("model_type", ["roberta", "modernbert", "bert"])
def test_model_type_is_the_familys_as_config_json_writes_it(model_type):
    cls = {"roberta": transformers.RobertaConfig, "modernbert": transformers.ModernBertConfig}
    sizes = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "pad_token_id": 0}
    config = load_config(cls.get(model_type, transformers.BertConfig)(**sizes, intermediate_size=37).to_dict())
    assert config.model_type == model_type
    assert config.to_dict()["model_type"] == config.get("model_type") == model_type
    assert config_to_hf(config)["model_type"] == model_type
    assert config.to_dict()["num_attention_heads"] == 4  # the flat face reads the nested field


@pytest.mark.parametrize("architectures", [[[]], "BertModel", [1], {"BertModel": 1}])
def test_architectures_that_name_no_class_are_refused(architectures):
    # the families index `architectures[0]`: a wrong type must be a located error, not a TypeError inside one
    with pytest.raises(ConfigError, match="architectures: must be a list of transformers class names"):
        bertblocks.load_config({**TINY_HF, "model_type": "bert", "architectures": architectures})


@pytest.mark.parametrize("model_type", ["bert", "modernbert", "electra"])
def test_an_empty_architectures_list_is_no_head(model_type):
    config = bertblocks.load_config({"model_type": model_type, "architectures": []})
    assert config.head is None
