"""The zoo: every preset builds the architecture transformers builds from the same config; listing, creation,
overrides, pretrained weights, third-party presets and the errors for bad names."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import transformers

import bertblocks
from bertblocks.core.component import Preset
from bertblocks.hf.config_json import config_to_hf
from bertblocks.plugins import presets as builtin_presets
from bertblocks.registry import DuplicatePresetError, Registry, UnknownPresetError
from tests.conftest import TINY_HF, V4, batch
from tests.tolerances import assert_close

ALL = bertblocks.list_presets()
# Google's BERT miniatures and the originals (Turc et al. 2019; Devlin et al. 2019): layers, hidden, heads.
SHAPES = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
VOCABS = {"uncased": 30522, "cased": 28996}


def test_the_zoo_holds_every_size_in_both_vocabularies_minilm_and_relative_variants():
    expected = {f"bert-{size}-{case}" for size in SHAPES for case in VOCABS}
    assert expected <= set(ALL)
    assert "all-minilm-l6-v2" in ALL
    assert bertblocks.list_presets("*-relative-key")
    assert bertblocks.list_presets("*-relative-key-query")
    for name in expected:
        size, case = name.split("-")[1:]
        cfg = bertblocks.load_config(name)
        layers, hidden, heads = SHAPES[size]
        assert (cfg.encoder.num_layers, cfg.hidden_size, cfg.encoder.attention.num_heads) == (layers, hidden, heads)
        assert cfg.encoder.feedforward.intermediate_size == 4 * hidden
        assert cfg.vocab_size == VOCABS[case]


def _v4_relative_keys() -> dict[str, tuple[int, ...]]:
    """What transformers 4 adds for relative positions, read from the golden v4 checkpoint (one per layer)."""
    from safetensors import safe_open

    with safe_open(V4 / "relative_key" / "model.safetensors", "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if "distance_embedding" in k}  # noqa: SIM118


#: the BERT-family presets (other families' presets are checked against their own classes in tests/families)
BERT_PRESETS = [name for name in ALL if bertblocks.load_config(name).family == "bert"]


@pytest.mark.parametrize("name", BERT_PRESETS)
def test_preset_builds_the_architecture_transformers_builds_from_its_config(name):
    """Same state-dict keys and shapes as transformers' BertModel for the preset's HF config (on the meta device:
    no memory, no initialisation, so even bert-large is cheap).

    transformers 5 dropped relative positions; for those presets the expected extra keys are v4's, one
    ``distance_embedding`` of ``(2 * max_position_embeddings - 1, head_dim)`` per layer, as the v4 fixture has,
    and no absolute position table.
    """
    cfg = bertblocks.load_config(name)
    with torch.device("meta"):
        ours = bertblocks.create_model(name)
        theirs = transformers.BertModel(transformers.BertConfig(**config_to_hf(cfg)))
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    expected = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    if cfg.position.name != "absolute":
        v4_cfg = json.loads((V4 / "relative_key" / "config.json").read_text())
        v4_head_dim = v4_cfg["hidden_size"] // v4_cfg["num_attention_heads"]
        v4_keys = _v4_relative_keys()
        assert set(v4_keys) == {
            f"encoder.layer.{i}.attention.self.distance_embedding.weight" for i in range(v4_cfg["num_hidden_layers"])
        }
        assert set(v4_keys.values()) == {(2 * v4_cfg["max_position_embeddings"] - 1, v4_head_dim)}
        # bertblocks has no unused absolute table for relative schemes (it broke DDP, transformers PR #31899);
        # the table v4 checkpoints carry is ignored on load (tests/parity/test_parity_v4_fixtures.py).
        del expected["embeddings.position_embeddings.weight"]
        head_dim = cfg.hidden_size // cfg.encoder.attention.num_heads
        for i in range(cfg.encoder.num_layers):
            key = f"encoder.layer.{i}.attention.self.distance_embedding.weight"
            expected[key] = (2 * cfg.max_position_embeddings - 1, head_dim)
    assert mine == expected


@pytest.mark.parametrize("file", builtin_presets.preset_files(), ids=lambda f: f.name)
def test_every_preset_file_starts_with_what_it_builds_and_how_to_run_and_override_it(file):
    text = file.read_text(encoding="utf-8")
    name = file.name.removesuffix(".yaml")
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert header[0].startswith(f"# {name}: ")
    assert len(header[0]) > len(f"# {name}: ") + 20  # a real description, not a stub
    assert any(f"bertblocks build {name}" in line for line in header)
    # the override example runs as shown (a kind without backends shows one of its own options)
    (example,) = [line.split("--set ", 1)[1].split()[0] for line in header if f"bertblocks build {name} --set " in line]
    bertblocks.load_config(name, [example])
    assert bertblocks.zoo.get_preset(name).description == header[0].removeprefix(f"# {name}: ")


def test_minilm_preset_is_the_shape_of_the_packaged_checkpoint():
    from bertblocks.sentence import minilm_path

    preset = bertblocks.load_config("all-minilm-l6-v2").model_dump()
    real = bertblocks.load_config(minilm_path()).model_dump()
    preset.pop("hf"), real.pop("hf")
    assert preset == real


def test_list_presets_wildcards_are_sorted_and_exact():
    assert bertblocks.list_presets() == sorted(ALL)
    assert bertblocks.list_presets("bert-tiny-*") == [
        "bert-tiny-cased",
        "bert-tiny-uncased",
        "bert-tiny-uncased-relative-key",
        "bert-tiny-uncased-relative-key-query",
    ]
    assert bertblocks.list_presets("bert-[bl]*-cased") == ["bert-base-cased", "bert-large-cased"]
    assert bertblocks.list_presets("no-such-*") == []
    assert bertblocks.list_presets("BERT-TINY-CASED") == []  # names are case-sensitive


def test_create_model_applies_fields_and_dotted_overrides():
    torch.manual_seed(0)
    model = bertblocks.create_model(
        "bert-mini-uncased-relative-key",
        hidden_dropout_prob=0.0,
        overrides={"encoder.num_layers": 2, "encoder.attention.backend": "eager"},
    )
    cfg = model.config
    assert (cfg.encoder.num_layers, cfg.hidden_dropout_prob) == (2, 0.0)
    assert cfg.encoder.attention.backend.name == "eager"
    assert cfg.position.name == "relative_key"
    assert len(model.encoder.layer) == 2
    listed = bertblocks.create_model("bert-tiny-uncased", overrides=["encoder.num_layers=1"])
    assert len(listed.encoder.layer) == 1
    # the registered preset is not changed by overrides
    assert bertblocks.zoo.get_preset("bert-mini-uncased-relative-key").config["encoder"]["num_layers"] == 4


def test_create_model_with_a_bad_override_names_the_preset_and_the_field():
    with pytest.raises(bertblocks.config.ConfigError) as err:
        bertblocks.create_model("bert-tiny-uncased", overrides={"encoder.attention.num_heads": 3})
    assert "preset bert-tiny-uncased" in str(err.value)
    assert "encoder.attention.num_heads: must divide hidden_size 128" in str(err.value)


def test_load_config_reads_a_preset_name_with_overrides():
    cfg = bertblocks.load_config("bert-base-cased", ["encoder.attention.backend=eager"])
    assert cfg.vocab_size == 28996
    assert cfg.encoder.attention.backend.name == "eager"


def test_a_file_wins_over_a_preset_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bert-tiny-uncased").write_text("hidden_size: 64\nencoder: {attention: {num_heads: 2}}\n")
    assert bertblocks.load_config("bert-tiny-uncased").hidden_size == 64


@pytest.mark.parametrize(
    "call",
    [
        lambda: bertblocks.zoo.get_preset("bert-tiny"),
        lambda: bertblocks.create_model("bert-tiny"),
        lambda: bertblocks.load_config("bert-tiny"),
    ],
    ids=["get_preset", "create_model", "load_config"],
)
def test_unknown_preset_names_the_closest_ones(call):
    with pytest.raises(UnknownPresetError) as err:
        call()
    message = str(err.value)
    assert message.startswith("unknown preset 'bert-tiny'")
    closest = message.split("closest: ")[1].split(";")[0].split(", ")
    assert "bert-tiny-uncased" in closest
    assert "bert-tiny-cased" in closest
    assert "all-minilm-l6-v2" in message.split("available: ")[1]


def test_a_missing_config_file_is_a_file_error_not_a_preset_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        bertblocks.load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(FileNotFoundError, match="config file not found"):
        bertblocks.load_config("configs/missing")


def test_create_model_loads_pretrained_weights_into_the_preset_architecture(hf_checkpoint):
    shape = {"hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512}
    directory = hf_checkpoint(**shape)
    small = {"vocab_size": TINY_HF["vocab_size"], "max_position_embeddings": TINY_HF["max_position_embeddings"]}
    ours = bertblocks.create_model("bert-tiny-uncased", pretrained=directory, **small)
    assert not ours.training
    theirs = transformers.BertModel.from_pretrained(directory).eval()
    inputs = batch(vocab=TINY_HF["vocab_size"])
    real = inputs["attention_mask"].bool()  # padded positions are not compared: bertblocks may skip them
    with torch.no_grad():
        mine, hf = ours(**inputs), theirs(**inputs)
    assert_close(mine.last_hidden_state[real], hf.last_hidden_state[real])
    assert_close(mine.pooler_output, hf.pooler_output)


def test_create_model_refuses_weights_of_another_architecture(hf_checkpoint):
    directory = hf_checkpoint()  # absolute positions, hidden 32
    with pytest.raises(bertblocks.hf.weights.CheckpointError, match="shape mismatch"):
        bertblocks.create_model("bert-tiny-uncased", pretrained=directory)


def test_create_model_with_a_missing_pretrained_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        bertblocks.create_model("bert-tiny-uncased", pretrained=tmp_path / "nowhere")


# ------------------------------------------------------------------------------------------- third-party presets
class _ZooPlugin:
    """An in-process plugin adding a preset, as a third-party package would through its entry point."""

    def __init__(self, *presets: Preset) -> None:
        self.presets = list(presets)

    def bertblocks_register_presets(self) -> list[Preset]:
        return self.presets


MICRO = {"vocab_size": 99, "hidden_size": 32, "encoder": {"num_layers": 1, "attention": {"num_heads": 2}}}


def test_a_plugin_adds_a_preset_that_create_model_builds():
    reg = Registry(load_entry_points=False)
    reg.register(_ZooPlugin(Preset("micro-bert", MICRO, "one layer")), name="zoo-plugin")
    assert bertblocks.list_presets("micro-*", registry=reg) == ["micro-bert"]
    preset = bertblocks.zoo.get_preset("micro-bert", registry=reg)
    assert preset.provider == "zoo-plugin"
    model = bertblocks.create_model("micro-bert", registry=reg)
    assert model.config.hidden_size == 32
    assert len(model.encoder.layer) == 1
    assert "micro-bert" not in bertblocks.list_presets()  # the process-wide registry is untouched


def test_a_duplicate_preset_names_both_providers():
    reg = Registry(load_entry_points=False)
    reg.register(_ZooPlugin(Preset("bert-tiny-uncased", MICRO)), name="copycat")
    assert [p.provider for p in reg.presets() if p.name == "bert-tiny-uncased"][1] == "copycat"  # both listed
    assert reg.get_preset("bert-mini-uncased").name == "bert-mini-uncased"  # other names keep working
    with pytest.raises(DuplicatePresetError) as err:
        reg.get_preset("bert-tiny-uncased")
    assert "bert-tiny-uncased" in str(err.value)
    assert "bertblocks.plugins.presets (bertblocks)" in str(err.value)
    assert "copycat" in str(err.value)


def test_a_broken_preset_hook_is_reported_and_the_others_still_work(caplog):
    class Broken:
        def bertblocks_register_presets(self) -> list[object]:
            return [{"name": "not-a-preset"}]

    reg = Registry(load_entry_points=False)
    reg.register(Broken(), name="broken-zoo")
    with caplog.at_level(logging.WARNING):
        assert "bert-tiny-uncased" in bertblocks.list_presets(registry=reg)
    assert [e.plugin for e in reg.load_errors] == ["broken-zoo"]
    with pytest.raises(UnknownPresetError, match="broken-zoo"):
        reg.get_preset("not-a-preset")


def test_a_preset_with_an_invalid_config_fails_when_used_with_its_name():
    reg = Registry(load_entry_points=False)
    reg.register(_ZooPlugin(Preset("bad-bert", {"hidden_size": 30, "encoder": {"attention": {"num_heads": 4}}})))
    assert "bad-bert" in bertblocks.list_presets(registry=reg)
    with pytest.raises(bertblocks.config.ConfigError, match="preset bad-bert"):
        bertblocks.create_model("bad-bert", registry=reg)


@pytest.mark.parametrize(
    ("head", "hf_class"),
    [("masked_lm", "BertForMaskedLM"), ("sequence_classification", "BertForSequenceClassification")],
)
def test_create_model_with_a_head_builds_the_task_model_transformers_builds(head, hf_class):
    with torch.device("meta"):
        ours = bertblocks.create_model("bert-mini-uncased", head=head, num_labels=3)
        cfg = ours.config
        theirs = getattr(transformers, hf_class)(transformers.BertConfig(**config_to_hf(cfg)))
    assert type(ours).__name__ == hf_class
    assert config_to_hf(cfg)["architectures"] == [hf_class]
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert mine == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}


def test_create_model_with_a_head_loads_a_backbone_checkpoint_and_leaves_the_head_new(hf_checkpoint):
    directory = hf_checkpoint(hidden_size=128, num_attention_heads=2, intermediate_size=512)
    small = {"vocab_size": TINY_HF["vocab_size"], "max_position_embeddings": TINY_HF["max_position_embeddings"]}
    model = bertblocks.create_model(
        "bert-tiny-uncased", head={"name": "sequence_classification"}, pretrained=directory, num_labels=4, **small
    )
    assert isinstance(model, bertblocks.BertForSequenceClassification)
    assert model.classifier.out_features == 4
    backbone = bertblocks.BertModel.from_pretrained(directory)
    for key, value in backbone.state_dict().items():
        assert torch.equal(model.bert.state_dict()[key], value), key


def test_an_unknown_head_names_the_closest():
    with pytest.raises(bertblocks.config.ConfigError) as err:
        bertblocks.create_model("bert-tiny-uncased", head="masked_ml")
    assert "preset bert-tiny-uncased" in str(err.value)
    assert "head: unknown head 'masked_ml'" in str(err.value)
    assert "did you mean 'masked_lm'?" in str(err.value)
