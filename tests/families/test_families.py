"""Families beyond parity: a third-party family, errors, strict loading, hybrids, incremental decoding."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.core.component import Component
from bertblocks.families.family import Family
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import Drop, KeyMap, Rename, Split
from bertblocks.hf.weights import CheckpointError
from bertblocks.registry import Registry, set_registry
from tests.families.reference import FAMILIES, save_hf
from tests.tolerances import assert_close

TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "max_position_embeddings": 64,
    "encoder": {"num_layers": 2, "attention": {"num_heads": 4}, "feedforward": {"intermediate_size": 37}},
}


# --------------------------------------------------------------------------------- a third-party family
_L, _O = "model.layers.{i}", "bert.encoder.layer.{i}"
TOY_KEYS = KeyMap(
    prefix="model",
    rules=(
        Split(
            f"{_L}.attn.Wqkv", (f"{_O}.attention.self.query", f"{_O}.attention.self.key", f"{_O}.attention.self.value")
        ),
        Rename(f"{_L}.attn.Wo", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.attn_norm", f"{_O}.attention.output.LayerNorm"),
        Rename(f"{_L}.mlp.up", f"{_O}.intermediate.dense"),
        Rename(f"{_L}.mlp.down", f"{_O}.output.dense"),
        Rename(f"{_L}.mlp_norm", f"{_O}.output.LayerNorm"),
        Rename("model.layers", "bert.encoder.layer"),
        Drop("model.rotary_cache"),
    ),
)


def _toy_from_hf(hf: Any) -> dict[str, Any]:
    return {**TINY, "vocab_size": hf["vocab"], "pooler": None, "hf": {}}


TOY = Family(
    model_type="toybert",
    config_from_hf=_toy_from_hf,
    config_to_hf=lambda config: {"vocab": config.vocab_size},
    key_map=TOY_KEYS,
    base_architecture="ToyBertModel",
    description="a private BERT variant with fused QKV",
)


def toy_registry() -> Registry:
    registry = Registry(load_entry_points=False)
    registry.register(
        SimpleNamespace(bertblocks_register_components=lambda: [Component("family", "toybert", lambda **_: TOY)]),
        name="toy-family",
    )
    set_registry(registry)
    return registry


def toy_checkpoint(directory, model: bertblocks.BertModel, qkv_rows: int | None = None) -> None:
    """Write ``model``'s weights in the toy format by hand (not through the key map under test)."""
    from safetensors.torch import save_file

    state = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith("embeddings.") and key not in ("embeddings.position_ids", "embeddings.token_type_ids"):
            out[f"model.{key}"] = value
    for i in range(2):
        ours = f"encoder.layer.{i}"
        for part in ("weight", "bias"):
            fused = torch.cat([state[f"{ours}.attention.self.{p}.{part}"] for p in ("query", "key", "value")])
            out[f"model.layers.{i}.attn.Wqkv.{part}"] = fused[:qkv_rows] if qkv_rows else fused
            out[f"model.layers.{i}.attn.Wo.{part}"] = state[f"{ours}.attention.output.dense.{part}"]
            out[f"model.layers.{i}.attn_norm.{part}"] = state[f"{ours}.attention.output.LayerNorm.{part}"]
            out[f"model.layers.{i}.mlp.up.{part}"] = state[f"{ours}.intermediate.dense.{part}"]
            out[f"model.layers.{i}.mlp.down.{part}"] = state[f"{ours}.output.dense.{part}"]
            out[f"model.layers.{i}.mlp_norm.{part}"] = state[f"{ours}.output.LayerNorm.{part}"]
    out["model.rotary_cache"] = torch.zeros(3)
    directory.mkdir()
    save_file({k: v.contiguous() for k, v in out.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"model_type": "toybert", "vocab": 99}))


def test_third_party_family_loads_its_own_checkpoint_format(tmp_path):
    toy_registry()
    torch.manual_seed(0)
    reference = bertblocks.create_model({**TINY, "pooler": None}).eval()
    toy_checkpoint(tmp_path / "toy", reference)
    loaded, info = bertblocks.from_pretrained(tmp_path / "toy", output_loading_info=True)
    assert loaded.config.family == "toybert"
    assert info.missing_keys == info.unexpected_keys == []
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():  # the key map only renames and splits tensors: the same modules, the same kernels
        assert torch.equal(reference(ids).last_hidden_state, loaded.eval()(ids).last_hidden_state)
    # and saves in its own format again: fused tensors joined, config.json the family's
    loaded.save_pretrained(tmp_path / "again")
    saved = json.loads((tmp_path / "again" / "config.json").read_text())
    assert saved["model_type"] == "toybert"
    assert saved["vocab"] == 99
    from bertblocks.hf.weights import read_state_dict

    written = read_state_dict([tmp_path / "again" / "model.safetensors"])
    # a backbone is written without its prefix, as transformers writes base models
    assert written["layers.1.attn.Wqkv.weight"].shape == (96, 32)
    assert "layers.1.attention.self.query.weight" not in written
    reloaded = bertblocks.from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():  # a round trip through the family's format: the same modules and weights
        assert torch.equal(reference(ids).last_hidden_state, reloaded(ids).last_hidden_state)


def test_third_party_family_through_a_registry_argument_alone(tmp_path):
    registry = toy_registry()
    set_registry(None)  # the process-wide registry knows no toybert: the argument must be used throughout
    reference = bertblocks.create_model({**TINY, "pooler": None})
    toy_checkpoint(tmp_path / "toy", reference)
    loaded = bertblocks.BertModel.from_pretrained(tmp_path / "toy", registry=registry)
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["model_type"] == "toybert"
    with pytest.raises(ConfigError, match="no model family handles 'toybert'"):
        bertblocks.from_pretrained(tmp_path / "toy")


def _terse_from_hf(hf: Any) -> dict[str, Any]:
    """Says nothing of the pooler or the token types; the fields but `vocab` (dtype, …) pass through `hf`."""
    return {**TINY, "vocab_size": hf.get("vocab", 99), "hf": {k: v for k, v in hf.items() if k != "vocab"}}


def test_a_family_states_its_fixed_facts_once_and_they_are_applied(tmp_path):
    """``Family.fixed`` is applied, not only checked: a translator that leaves a fixed value out still builds the
    family's model, and the checkpoint round-trips."""
    from dataclasses import replace

    from bertblocks.hf.config_json import config_from_hf

    terse = replace(
        TOY,
        model_type="tersebert",
        config_from_hf=_terse_from_hf,
        fixed={"pooler": None, "embedding.token_types": False},
        fields={"vocab": HFField(int, ge=1)},
    )
    registry = Registry(load_entry_points=False)
    registry.register(
        SimpleNamespace(bertblocks_register_components=lambda: [Component("family", "tersebert", lambda **_: terse)]),
        name="terse-family",
    )
    set_registry(registry)
    data = config_from_hf({"model_type": "tersebert", "vocab": 99})
    assert data["pooler"] is None
    assert data["embedding"]["token_types"] is False
    model = bertblocks.create_model(data)
    assert model.pooler is None
    assert model.config.embedding.token_types is False
    model.save_pretrained(tmp_path / "terse")
    saved = json.loads((tmp_path / "terse" / "config.json").read_text())
    assert saved["vocab"] == 99
    assert "bertblocks" not in saved  # the fixed facts are the family's: nothing to carry for them
    again = bertblocks.from_pretrained(tmp_path / "terse")
    assert again.config.model_dump(exclude={"hf"}) == model.config.model_dump(exclude={"hf"})
    with pytest.raises(ConfigError, match="tersebert family requires None"):  # a value that says otherwise: refused
        config_from_hf({"model_type": "tersebert", "vocab": 99, "bertblocks": {"pooler": "first_token"}})


def test_fused_tensor_of_the_wrong_size_is_a_clear_error(tmp_path):
    toy_registry()
    reference = bertblocks.create_model({**TINY, "pooler": None})
    toy_checkpoint(tmp_path / "toy", reference, qkv_rows=90)
    with pytest.raises(CheckpointError) as info:
        bertblocks.from_pretrained(tmp_path / "toy")
    message = str(info.value)
    assert "toybert checkpoint" in message
    assert (
        "'model.layers.0.attn.Wqkv.bias' has shape (90,)" in message or "'model.layers.0.attn.Wqkv.weight'" in message
    )
    assert "(96" in message


# ----------------------------------------------------------------------------------------------- errors
def test_unknown_model_type_lists_the_families(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(ConfigError) as info:
        bertblocks.load_config(tmp_path)
    message = str(info.value)
    assert "no model family handles 'gpt2'" in message
    for family in ("bert", "camembert", "distilbert", "electra", "ernie", "roberta", "xlm-roberta"):
        assert family in message


def _roberta_json(tmp_path, **extra: Any):
    config = transformers.RobertaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **extra
    )
    config.save_pretrained(tmp_path)
    return tmp_path


def test_config_field_contradicting_the_family_is_an_error(tmp_path):
    directory = _roberta_json(tmp_path)
    data = json.loads((directory / "config.json").read_text())
    data["bertblocks"] = {"embedding": {"position_offset": "none"}}
    (directory / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        bertblocks.load_config(directory)
    assert "embedding.position_offset: is 'none', but the roberta family requires 'padding'" in str(info.value)


def test_distilbert_config_with_a_bert_only_field_is_an_error(tmp_path):
    transformers.DistilBertConfig(dim=32, n_heads=4, n_layers=2, hidden_dim=37).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["type_vocab_size"] = 2
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="distilbert: type_vocab_size is not a DistilBERT config field"):
        bertblocks.load_config(tmp_path)


def test_checkpoint_key_that_fits_nowhere_is_an_error(tmp_path):
    torch.manual_seed(0)
    config = transformers.RobertaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37
    )
    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.RobertaForMaskedLM(config).save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    state["decoder_head.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"fit nowhere in a roberta model.*decoder_head\.weight"):
        bertblocks.from_pretrained(tmp_path, head="auto")


# ------------------------------------------------------------------------------------------------ hybrids
def test_hybrid_builds_trains_saves_and_reloads_as_a_bertblocks_hybrid(tmp_path):
    hybrid = {
        **TINY,
        "family": "bertblocks-hybrid",
        "embedding": {"name": "bert", "position_offset": "padding", "token_types": False, "embedding_size": 16},
        "pad_token_id": 1,
        "head": {"name": "dense_classification", "activation": "gelu"},
    }
    model = bertblocks.create_model(hybrid)
    ids = torch.randint(2, 99, (2, 6))
    loss = model(ids, labels=torch.tensor([0, 1])).loss
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "bertblocks-hybrid"
    assert saved["bertblocks"]["embedding"]["position_offset"] == "padding"
    again = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    with torch.no_grad():  # a reload into the same modules: the same kernels on the same data
        assert torch.equal(model.eval()(ids).logits, again(ids).logits)


# ------------------------------------------------------------------------------------ incremental decoding
@pytest.mark.parametrize(
    ("family_name", "cls"),
    [("roberta", "RobertaForCausalLM"), ("electra", "ElectraForCausalLM"), ("ernie", "ErnieForCausalLM")],
)
def test_incremental_decoding_equals_a_full_pass(tmp_path, family_name, cls):
    save_hf(FAMILIES[family_name], cls, tmp_path)  # a causal LM: saved with is_decoder=True
    model = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    ids = torch.randint(3, 99, (2, 8))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :5], use_cache=True)
        steps = [out.logits]
        cache = out.past_key_values
        for i in range(5, 8):
            out = model(ids[:, i : i + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits)
    assert_close(torch.cat(steps, dim=1), full)


# ------------------------------------------------------------------------------- packing, config round trip
def test_packed_roberta_equals_padded_on_real_tokens(tmp_path):
    torch.manual_seed(0)
    config = transformers.RobertaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37
    )
    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.RobertaModel(config).eval().save_pretrained(tmp_path)
    padded = bertblocks.from_pretrained(tmp_path, ["encoder.packing=never"]).eval()
    packed = bertblocks.from_pretrained(tmp_path, ["encoder.packing=always"]).eval()
    ids = torch.randint(3, 99, (3, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    ids = ids.masked_fill(mask == 0, 1)  # RoBERTa's padding token: positions skip it
    with torch.no_grad():
        a = padded(ids, attention_mask=mask).last_hidden_state[mask.bool()]
        b = packed(ids, attention_mask=mask).last_hidden_state[mask.bool()]
    assert_close(a, b)


@pytest.mark.parametrize(
    ("config_cls", "extra"),
    [
        ("RobertaConfig", {}),
        ("ElectraConfig", {"embedding_size": 16}),
        ("AlbertConfig", {"embedding_size": 16}),
        ("ErnieConfig", {"use_task_id": True}),
        # no task table: the family's field is carried in `hf:`, and is no misspelling of type_vocab_size
        ("ErnieConfig", {"use_task_id": False, "task_type_vocab_size": 5}),
    ],
)
@pytest.mark.filterwarnings("error::bertblocks.hf.misspelt_keys.UnknownConfigKeyWarning")
def test_config_json_round_trips_through_yaml(tmp_path, config_cls, extra):
    from bertblocks import cli

    getattr(transformers, config_cls)(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **extra
    ).save_pretrained(tmp_path)
    original = json.loads((tmp_path / "config.json").read_text())
    assert cli.main(["convert", str(tmp_path / "config.json"), str(tmp_path / "c.yaml")]) == 0
    assert cli.main(["convert", str(tmp_path / "c.yaml"), str(tmp_path / "back.json")]) == 0
    back = json.loads((tmp_path / "back.json").read_text())
    assert "bertblocks" not in back  # nothing the family's own fields cannot say
    for key, value in original.items():
        if key not in ("transformers_version", "architectures", "dtype", "torch_dtype"):
            assert back.get(key) == value, key
