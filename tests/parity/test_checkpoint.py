"""Checkpoint I/O: every form an HF BERT checkpoint comes in, and every way one can fail to fit.

Each loading test compares the loaded model against transformers on the same weights, so a key that was
silently skipped (left as initialised) shows up as a numeric difference, not only as a report entry.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.hf.weights import CheckpointError
from tests.conftest import TINY, V4, batch
from tests.tolerances import assert_close


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _hf_backbone(directory: Path) -> transformers.BertModel:
    return transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()


def _assert_parity(ours: bertblocks.BertModel, hf: torch.nn.Module, pooler: bool = True) -> None:
    ours.eval()
    inputs = batch()
    real = inputs["attention_mask"].bool()  # a packed forward pass (the default here) zeroes padded positions
    with torch.no_grad():
        mine, theirs = ours(**inputs), hf(**inputs)
    assert_close(mine.last_hidden_state[real], theirs.last_hidden_state[real])
    if pooler:
        assert_close(mine.pooler_output, theirs.pooler_output)


def _rewrite(directory: Path, change) -> None:
    """Apply ``change`` to the single safetensors file of ``directory`` in place."""
    path = directory / "model.safetensors"
    state = load_file(path)
    change(state)
    save_file(state, path, metadata={"format": "pt"})


# ------------------------------------------------------------------------------------ forms of checkpoint
@pytest.mark.parametrize("cls", ["BertForMaskedLM", "BertForPreTraining"])
def test_bert_prefixed_task_checkpoint_loads_the_backbone(hf_checkpoint, cls: str):
    directory = hf_checkpoint(cls)
    assert any(k.startswith("bert.") for k in load_file(directory / "model.safetensors"))
    ours, info = bertblocks.from_pretrained(directory, output_loading_info=True)
    assert info.unexpected_keys
    assert all(k.startswith("cls.") for k in info.unexpected_keys)
    assert "cls.predictions.transform.dense.weight" in info.unexpected_keys
    assert not info.mismatched_keys
    task_model = getattr(transformers, cls).from_pretrained(directory).eval()
    if cls == "BertForMaskedLM":
        # HF's masked-LM backbone has no pooler: ours keeps one, newly initialised, and says so
        assert sorted(info.missing_keys) == ["pooler.dense.bias", "pooler.dense.weight"]
        _assert_parity(ours, task_model.bert, pooler=False)
    else:
        assert info.missing_keys == []
        _assert_parity(ours, task_model.bert)


def test_legacy_gamma_beta_names_and_stale_position_ids(hf_checkpoint):
    directory = hf_checkpoint("BertForPreTraining")
    hf = transformers.BertForPreTraining.from_pretrained(directory).eval().bert

    def legacy(state: dict[str, torch.Tensor]) -> None:
        # what old Google conversions (and bert-base-uncased's own safetensors) contain
        for key in [k for k in state if ".LayerNorm." in k]:
            new = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
            state[new] = state.pop(key)
        state["bert.embeddings.position_ids"] = torch.arange(64, dtype=torch.int64)[None]

    _rewrite(directory, legacy)
    keys = load_file(directory / "model.safetensors")
    assert "bert.encoder.layer.0.output.LayerNorm.gamma" in keys
    assert "bert.encoder.layer.0.output.LayerNorm.weight" not in keys
    ours, info = bertblocks.from_pretrained(directory, output_loading_info=True)
    assert info.missing_keys == []
    assert info.ignored_keys == ["embeddings.position_ids"]
    assert all(k.startswith("cls.") for k in info.unexpected_keys)
    _assert_parity(ours, hf)


def test_pytorch_model_bin_loads_with_weights_only(hf_checkpoint, monkeypatch):
    directory = hf_checkpoint()
    hf = _hf_backbone(directory)
    # transformers 5 only writes safetensors; a .bin is what transformers 4 wrote: torch.save(state_dict)
    (directory / "model.safetensors").unlink()
    torch.save(hf.state_dict(), directory / "pytorch_model.bin")

    calls = []
    original = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    ours, info = bertblocks.from_pretrained(directory, output_loading_info=True)
    assert calls == [True]
    assert info.missing_keys == info.unexpected_keys == []
    _assert_parity(ours, hf)


def test_transformers_sharded_checkpoint_loads(hf_checkpoint, tmp_path: Path):
    source = hf_checkpoint()
    hf = _hf_backbone(source)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="20KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    assert not (sharded / "model.safetensors").exists()
    ours, info = bertblocks.from_pretrained(sharded, output_loading_info=True)
    assert info.missing_keys == info.unexpected_keys == []
    _assert_parity(ours, hf)


@pytest.mark.parametrize("safe", [True, False])
def test_our_sharded_checkpoint_loads_in_transformers_and_back(tmp_path: Path, safe: bool):
    torch.manual_seed(1)
    ours = bertblocks.create_model({**TINY, "initializer_range": 0.2}).eval()
    directory = tmp_path / "ours"
    ours.save_pretrained(directory, max_shard_size=20_000, safe_serialization=safe)
    suffix = "safetensors" if safe else "bin"
    index_name = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
    index = json.loads((directory / index_name).read_text())
    state = ours.state_dict()
    assert set(index["weight_map"]) == set(state)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    files = sorted({p.name for p in directory.glob(f"*.{suffix}")})
    assert files == sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    for name in files:  # each shard within the limit, unless a single tensor is larger
        shard = load_file(directory / name) if safe else torch.load(directory / name, weights_only=True)
        size = sum(t.numel() * t.element_size() for t in shard.values())
        assert size <= 20_000 or len(shard) == 1

    back, info = bertblocks.from_pretrained(directory, output_loading_info=True)
    assert info.missing_keys == info.unexpected_keys == []
    _assert_parity(back, ours)
    if safe:
        hf, hf_info = transformers.BertModel.from_pretrained(directory, output_loading_info=True)
        assert not hf_info["missing_keys"]
        assert not hf_info["unexpected_keys"]
        assert not hf_info["mismatched_keys"]
        _assert_parity(ours, hf.eval())


def test_single_file_save_writes_hf_names_and_config(tmp_path: Path):
    ours = bertblocks.create_model(TINY)
    ours.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    saved = load_file(tmp_path / "model.safetensors")
    assert set(saved) == set(ours.state_dict())
    assert "embeddings.position_ids" not in saved  # non-persistent buffers are never written
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]
    assert config["model_type"] == "bert"


# ----------------------------------------------------------------------------------- what does not fit
def test_mismatched_shape_names_the_key_and_both_shapes(hf_checkpoint):
    directory = hf_checkpoint()
    key = "encoder.layer.1.intermediate.dense.weight"

    def shrink(state: dict[str, torch.Tensor]) -> None:
        state[key] = state[key][:36].clone()

    _rewrite(directory, shrink)
    with pytest.raises(CheckpointError) as info:
        bertblocks.from_pretrained(directory)
    assert f"{key}: (36, 32) vs (37, 32)" in str(info.value)
    assert "shape mismatch (checkpoint vs model)" in str(info.value)


def test_missing_backbone_tensor_is_an_error_unless_not_strict(hf_checkpoint, caplog):
    directory = hf_checkpoint()
    hf = _hf_backbone(directory)
    key = "encoder.layer.1.output.dense.bias"
    _rewrite(directory, lambda state: state.pop(key))
    with pytest.raises(CheckpointError, match=f"weights missing from the checkpoint: {key}$"):
        bertblocks.from_pretrained(directory)

    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        ours, info = bertblocks.from_pretrained(directory, strict=False, output_loading_info=True)
    assert info.missing_keys == [key]
    assert key in caplog.text
    # everything else loaded: putting the one tensor back restores parity
    with torch.no_grad():
        ours.encoder.layer[1].output.dense.bias.copy_(hf.encoder.layer[1].output.dense.bias)
    _assert_parity(ours, hf)


def test_relative_checkpoint_with_absolute_positions_is_refused():
    # transformers 5 loads this with only an "unexpected keys" line and gives wrong numbers; we refuse
    with pytest.raises(CheckpointError) as info:
        bertblocks.from_pretrained(V4 / "relative_key", ["position=absolute"])
    message = str(info.value)
    assert "weights this config has no place for" in message
    assert "encoder.layer.0.attention.self.distance_embedding.weight" in message
    assert "encoder.layer.1.attention.self.distance_embedding.weight" in message


def test_absolute_checkpoint_with_relative_positions_is_refused(hf_checkpoint):
    with pytest.raises(CheckpointError) as info:
        bertblocks.from_pretrained(hf_checkpoint(), ["position=relative_key"])
    assert "weights missing from the checkpoint: encoder.layer.0.attention.self.distance_embedding.weight" in str(
        info.value
    )


def test_checkpoint_with_more_layers_than_the_config_is_refused(hf_checkpoint):
    with pytest.raises(CheckpointError, match=r"has no place for .*encoder\.layer\.1\.attention\.self\.query\.weight"):
        bertblocks.from_pretrained(hf_checkpoint(), ["encoder.num_layers=1"])


def test_relative_checkpoint_drops_the_unused_absolute_table():
    ours, info = bertblocks.from_pretrained(V4 / "relative_key", output_loading_info=True)
    assert info.ignored_keys == ["embeddings.position_embeddings.weight"]
    assert info.unexpected_keys == info.missing_keys == []
    assert not hasattr(ours.embeddings, "position_embeddings")


# ---------------------------------------------------------------------------------------- missing files
def test_missing_weights_file_is_file_not_found(hf_checkpoint):
    directory = hf_checkpoint()
    (directory / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no weights in .*: expected model\.safetensors"):
        bertblocks.from_pretrained(directory)


def test_index_naming_a_missing_shard_is_file_not_found(tmp_path: Path):
    bertblocks.create_model(TINY).save_pretrained(tmp_path, max_shard_size=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    lost = sorted(set(index["weight_map"].values()))[1]
    (tmp_path / lost).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"names shards that are missing: ['{lost}']")):
        bertblocks.from_pretrained(tmp_path)


def test_not_a_directory_is_file_not_found(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        bertblocks.from_pretrained(tmp_path / "nowhere")
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="is a file; expected a checkpoint directory"):
        bertblocks.from_pretrained(file)
    with pytest.raises(FileNotFoundError, match=r"config file not found: .*config\.json"):
        bertblocks.from_pretrained(tmp_path)  # a directory without config.json
