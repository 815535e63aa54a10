"""Faults contained where they happen: plugins that clash or raise, inputs and caches that do not fit, HF
config keys that are misspelt, paths that do not exist. Each gives a clear error naming what is wrong."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import pytest
import torch
from conftest import TINY

import bertblocks
from bertblocks import BertModel
from bertblocks.cli import main
from bertblocks.core.cache import KVCache
from bertblocks.core.component import Component
from bertblocks.hf.hub import PretrainedNotFoundError, looks_like_a_path
from bertblocks.hf.misspelt_keys import UnknownConfigKeyWarning
from bertblocks.plugins.feedforward import build_bert_feedforward
from bertblocks.registry import DuplicateComponentError, Registry, set_registry
from bertblocks.registry.builder import BuildError


# ------------------------------------------------------------------------------------------------ plugins
class _Clash:
    """A third-party plugin that registers a feed-forward block under the built-in's name."""

    def bertblocks_register_components(self) -> list[Component]:
        return [
            Component("feedforward", "bert", build_bert_feedforward, description="a copy"),
        ]


def _raises(**kwargs: Any) -> Any:
    raise RuntimeError("boom: the plugin's own bug")


@pytest.fixture
def clashing_registry():
    reg = Registry(load_entry_points=False)
    reg.register(_Clash(), name="clash", distribution="bertblocks-clash", version="0.3")
    set_registry(reg)
    yield reg
    set_registry(None)


def test_a_clashing_name_is_an_error_only_where_it_is_used(clashing_registry):
    reg = clashing_registry
    # everything else works: a config that uses other components builds
    assert reg.get("backend", "sdpa").name == "sdpa"
    with pytest.raises(DuplicateComponentError) as info:
        bertblocks.load_config(TINY, registry=reg)  # validation looks the name up: refused there
    assert str(info.value) == (
        "feedforward 'bert' is registered twice: by bertblocks.plugins.feedforward (bertblocks) and by "
        "clash (bertblocks-clash)"
    )
    listed = [c.provider for c in reg.components("feedforward") if c.name == "bert"]
    assert listed == ["bertblocks.plugins.feedforward (bertblocks)", "clash (bertblocks-clash)"]
    assert reg.conflicts == [
        "feedforward 'bert' is registered by bertblocks.plugins.feedforward (bertblocks) "
        "and by clash (bertblocks-clash)"
    ]


def test_cli_plugins_and_components_still_work_and_show_both_providers(clashing_registry, capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^clash +bertblocks-clash +0\.3 +register_components$", out, re.MULTILINE)
    assert "CONFLICT  feedforward 'bert' is registered by bertblocks.plugins.feedforward (bertblocks) and by " in out
    assert main(["--json", "components", "feedforward"]) == 0
    listed = [(c["name"], c["distribution"]) for c in json.loads(capsys.readouterr().out)]
    assert ("bert", "bertblocks") in listed
    assert ("bert", "bertblocks-clash") in listed
    assert main(["validate", "bert-tiny-uncased"]) == 1  # uses the clashing name: a user error, not a bug
    assert "registered twice" in capsys.readouterr().err


class _Broken:
    def bertblocks_register_components(self) -> list[Component]:
        return [Component("feedforward", "broken", _raises, description="raises")]


def test_a_factory_exception_is_a_build_error_naming_layer_component_and_distribution():
    reg = Registry(load_entry_points=False)
    reg.register(_Broken(), name="broken-ff", distribution="bertblocks-broken", version="1.0")
    data = {**TINY, "encoder": {**TINY["encoder"], "overrides": [{"layers": 1, "feedforward": {"name": "broken"}}]}}
    config = bertblocks.load_config(data, registry=reg)
    with pytest.raises(BuildError) as info:
        bertblocks.create_model(config, registry=reg)
    assert str(info.value) == (
        "encoder layer 1 feedforward: feedforward 'broken' from broken-ff (bertblocks-broken) failed to build: "
        "RuntimeError: boom: the plugin's own bug (config: encoder.overrides.0.feedforward)"
    )
    assert isinstance(info.value.__cause__, RuntimeError)  # the plugin's traceback is kept


# ------------------------------------------------------------------------------------------------- inputs
@pytest.fixture(scope="module")
def decoder() -> BertModel:
    torch.manual_seed(0)
    cfg = bertblocks.load_config({**TINY, "is_decoder": True})
    return bertblocks.create_model(cfg).eval()


def test_a_cache_whose_keys_and_values_disagree_in_length_is_rejected(decoder):
    head_dim = 32 // 4
    keys, values = torch.zeros(1, 4, 3, head_dim), torch.zeros(1, 4, 5, head_dim)
    with pytest.raises(ValueError, match=r"past_key_values layer 0: keys \(1, 4, 3, 8\) and values \(1, 4, 5, 8\)"):
        decoder(torch.ones(1, 1, dtype=torch.long), past_key_values=[(keys, values)] * 2)
    cache = KVCache(2)
    with pytest.raises(ValueError, match=r"cross-attention: keys .* disagree"):
        cache.set_cross(0, torch.zeros(1, 4, 3, 8), torch.zeros(2, 4, 3, 8))
    with pytest.raises(ValueError, match="must be 4-D"):
        cache.update(1, torch.zeros(4, 3, 8), torch.zeros(4, 3, 8))


def test_a_cache_made_by_the_model_still_decodes(decoder):
    ids = torch.randint(0, 99, (2, 6))
    with torch.no_grad():
        full = decoder(ids).last_hidden_state
        first = decoder(ids[:, :4], use_cache=True)
        step = decoder(ids[:, 4:], past_key_values=first.past_key_values, use_cache=True).last_hidden_state
    torch.testing.assert_close(step, full[:, 4:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("given", ["input_ids", "inputs_embeds"])
def test_a_zero_length_input_is_a_clear_error(decoder, given):
    inputs = {"input_ids": torch.zeros(2, 0, dtype=torch.long), "inputs_embeds": torch.zeros(2, 0, 32)}
    with pytest.raises(ValueError, match=rf"^{given} is empty \(sequence length 0\)"):
        decoder(**{given: inputs[given]})


def test_nan_in_the_attention_mask_is_a_clear_error(decoder):
    mask = torch.tensor([[1.0, float("nan"), 1.0]])
    with pytest.raises(ValueError, match="attention_mask holds NaN"):
        decoder(torch.ones(1, 3, dtype=torch.long), attention_mask=mask)


# ------------------------------------------------------------------------------------- HF config.json keys
def test_a_misspelt_hf_key_warns_with_the_closest_known_name(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"model_type": "bert", "num_hiden_layers": 2, "hidden_size": 32, "num_attention_heads": 4})
    )
    with pytest.warns(
        UnknownConfigKeyWarning, match=r"unknown key 'num_hiden_layers' \(did you mean 'num_hidden_layers'\?\)"
    ):
        cfg = bertblocks.load_config(path)
    assert cfg.hf["num_hiden_layers"] == 2  # kept, as HF keeps unknown keys


def test_extra_keys_hf_writes_do_not_warn(hf_checkpoint):
    directory = hf_checkpoint()
    data = json.loads((directory / "config.json").read_text())
    data.update(
        {"tokenizer_class": "BertTokenizer", "bos_token_id": 0, "eos_token_id": 2, "gradient_checkpointing": False}
    )
    (directory / "config.json").write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownConfigKeyWarning)
        bertblocks.load_config(directory)


# --------------------------------------------------------------------------------------- paths vs hub ids
@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("org/name", False),
        ("bert-base-uncased", False),
        ("./model", True),
        ("~/model", True),
        ("/abs/model", True),
        ("a/b/c", True),
        ("dir\\model", True),
        ("config.json", True),
        ("study.yaml", True),
        ("folder/config.yml", True),
    ],
)
def test_what_looks_like_a_path(text, path):
    assert looks_like_a_path(text) is path


def test_a_missing_path_is_never_tried_as_a_hub_id(tmp_path, monkeypatch):
    import huggingface_hub

    def no_hub(*args: object, **kwargs: object) -> None:
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for text in ("models/bert", "./bert", "nothing/here/at-all", "missing.json"):
        with pytest.raises(PretrainedNotFoundError, match="looks like a path, so it was not tried as a hub id"):
            bertblocks.from_pretrained(text)
    assert main(["embed", "--model", "models/bert", "hi"]) == 1


# ------------------------------------------------------------------------------------------- CLI exits
def _checkpoint_with(directory: Any, files: dict[str, bytes | str], drop: tuple[str, ...] = ()) -> str:
    for name in drop:
        (directory / name).unlink()
    for name, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        (directory / name).write_bytes(data)
    return str(directory)


@pytest.mark.parametrize(
    ("files", "drop", "message"),
    [
        ({"model.safetensors.index.json": "{}"}, ("model.safetensors",), "is not a shard index with a weight_map"),
        (
            {"model.safetensors.index.json": '{"weight_map": {"w": "../../outside.safetensors"}}'},
            ("model.safetensors",),
            "names shards that are not file names: ['../../outside.safetensors']",
        ),
        ({"tokenizer.json": "{not json"}, (), "tokenizer.json is not a valid tokenizer file"),
        ({"config.json": "[1, 2]"}, (), "expected a mapping at the top"),
    ],
)
def test_cli_user_errors_in_checkpoint_files_exit_1_naming_the_file(hf_checkpoint, capsys, files, drop, message):
    directory = _checkpoint_with(hf_checkpoint(), files, drop)
    assert main(["embed", "--model", directory, "hello"]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "bug" not in err


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path, capsys):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00junk")
    assert main(["validate", str(path)]) == 1
    expected = f"invalid config in {path} (1 error):\n  line 1: not UTF-8 text (byte 0xff at column 1)"
    assert expected in capsys.readouterr().err
