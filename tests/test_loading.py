"""from_pretrained builds parameters on the meta device and takes the checkpoint's tensors: no random
initialisation of weights that the checkpoint replaces, and only missing weights initialised."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.hf.weights import CheckpointError, map_safetensors
from bertblocks.models.meta_device import deferred_init
from tests.conftest import batch, max_diff


def test_loading_a_full_checkpoint_runs_no_initialiser(hf_checkpoint, init_calls):
    directory = hf_checkpoint()
    init_calls.clear()
    model = bertblocks.from_pretrained(directory)
    assert init_calls == []
    assert not any(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())


def test_only_missing_weights_are_initialised(hf_checkpoint, init_calls):
    directory = hf_checkpoint()  # a backbone: the classifier is new
    init_calls.clear()
    model, info = bertblocks.BertForSequenceClassification.from_pretrained(directory, output_loading_info=True)
    assert info.missing_keys == ["classifier.weight", "classifier.bias"]
    assert init_calls == [("normal_", (2, 32))]  # the classifier weight (its bias starts at zero)
    assert model.classifier.weight.std() > 0
    assert not any(p.is_meta for p in model.parameters())


def test_tied_decoder_stays_tied_after_loading(hf_checkpoint):
    model = bertblocks.BertForMaskedLM.from_pretrained(hf_checkpoint("BertForMaskedLM"))
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})


def test_half_precision_checkpoint_loads_into_fp32(hf_checkpoint, tmp_path):
    directory = hf_checkpoint()
    reference = bertblocks.from_pretrained(directory).eval()
    state = load_file(directory / "model.safetensors")
    save_file({k: v.half() for k, v in state.items()}, directory / "model.safetensors", metadata={"format": "pt"})
    model = bertblocks.from_pretrained(directory).eval()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with torch.no_grad():
        # the weights were rounded to fp16 (about 1e-3 relative): a half-precision bound, not the fp32 one
        assert max_diff(model(**batch()).pooler_output, reference(**batch()).pooler_output) <= 1e-2


def test_deferred_init_keeps_buffers_real_and_restores_modules():
    with deferred_init():
        layer = torch.nn.Linear(4, 3)
        layer.register_buffer("steps", torch.arange(3))
    assert layer.weight.is_meta
    assert torch.equal(layer.steps, torch.arange(3))
    assert not torch.nn.Linear(4, 3).weight.is_meta  # patched only inside the block


def test_mapped_safetensors_equal_safetensors_own_reader(tmp_path):
    tensors = {
        "f32": torch.randn(3, 4),
        "f16": torch.randn(5).half(),
        "bf16": torch.randn(2, 2).bfloat16(),
        "i64": torch.arange(7),
        "flag": torch.tensor([True, False]),
        "empty": torch.empty(0, 3),
    }
    path = tmp_path / "t.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    mapped = map_safetensors(path)
    reference = load_file(path)
    assert mapped.keys() == reference.keys()
    for name in tensors:
        assert mapped[name].dtype == reference[name].dtype
        assert torch.equal(mapped[name], reference[name])
    # the mapping is private: writing to a loaded tensor never changes the file
    mapped["f32"].add_(1.0)
    assert torch.equal(load_file(path)["f32"], tensors["f32"])


def test_broken_safetensors_file_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        map_safetensors(path)
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match="is empty"):
        map_safetensors(path)
