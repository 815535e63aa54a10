"""One load path and one save path for every model class: the backbone, the task models and the encoder-decoder
load from a local directory and from a hub cache on the meta device, map keys through one key-map hook, and
report missing and unexpected keys in the same words."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import bertblocks
from bertblocks.families.keymap import BERT_KEY_MAP, KeyMap, SuffixRenames
from bertblocks.hf.weights import CheckpointError, read_state_dict
from bertblocks.models.encoder_decoder import BertEncoderDecoder
from bertblocks.models.pretrained import PretrainedModel, map_checkpoint_keys
from tests.conftest import TINY, batch, max_diff
from tests.parity.test_hub import files_of, lay_out_cache

SIDE = {"vocab_size": 99, "hidden_size": 32, "encoder": {"num_layers": 2, "attention": {"num_heads": 4}}}
BERT2BERT = {"encoder": SIDE, "decoder": {**SIDE, "hidden_size": 48}, "decoder_start_token_id": 2, "pad_token_id": 0}


@pytest.fixture
def bert2bert_dir(tmp_path):
    torch.manual_seed(0)
    model = bertblocks.create_model(BERT2BERT).eval()
    model.save_pretrained(tmp_path / "b2b")
    return model, tmp_path / "b2b"


def _seq2seq(model):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 99, (2, 6), generator=g)
    labels = torch.randint(1, 99, (2, 4), generator=g)
    with torch.no_grad():
        return model(input_ids=ids, labels=labels)


# ------------------------------------------------------------------------------------- every class, one path
def test_every_model_class_shares_the_one_load_and_save_path():
    classes = [bertblocks.BertModel, bertblocks.BertTaskModel, bertblocks.BertForMaskedLM, BertEncoderDecoder]
    for cls in classes:
        assert issubclass(cls, PretrainedModel), cls
        for method in ("from_pretrained", "load_checkpoint", "save_pretrained"):
            # inherited, never redefined: loading and saving are written once
            assert getattr(cls, method).__qualname__.startswith("PretrainedModel."), (cls, method)


def test_encoder_decoder_loads_on_the_meta_device_without_initialising_loaded_weights(bert2bert_dir, init_calls):
    reference, directory = bert2bert_dir
    init_calls.clear()
    model, info = BertEncoderDecoder.from_pretrained(directory, output_loading_info=True)
    assert init_calls == []  # every weight came from the checkpoint: nothing drawn at random
    assert not any(p.is_meta for p in model.parameters())
    assert info.missing_keys == info.unexpected_keys == []
    assert model.decoder.cls.predictions.decoder.weight is model.decoder.bert.embeddings.word_embeddings.weight
    # the checkpoint's weights in the same classes: the same kernels on the same data, so bit-equal
    assert max_diff(_seq2seq(model.eval()).logits, _seq2seq(reference).logits) == 0.0


def test_encoder_decoder_initialises_only_what_the_checkpoint_lacks(bert2bert_dir, init_calls):
    _, directory = bert2bert_dir
    state = read_state_dict([directory / "model.safetensors"])
    kept = {k: v.clone() for k, v in state.items() if not k.startswith("enc_to_dec_proj.")}
    save_file(kept, str(directory / "model.safetensors"), metadata={"format": "pt"})
    init_calls.clear()
    model, info = BertEncoderDecoder.from_pretrained(directory, output_loading_info=True)
    assert sorted(info.missing_keys) == ["enc_to_dec_proj.bias", "enc_to_dec_proj.weight"]
    assert init_calls == [("normal_", (48, 32))]  # the projection's weight only; its bias starts at zero
    assert model.enc_to_dec_proj.weight.std() > 0


def test_encoder_decoder_loads_from_a_hub_cache_offline(bert2bert_dir, tmp_path):
    reference, directory = bert2bert_dir
    lay_out_cache(tmp_path / "cache", "acme/bert2bert", files_of(directory))
    model = BertEncoderDecoder.from_pretrained("acme/bert2bert", cache_dir=tmp_path / "cache", local_files_only=True)
    # the checkpoint's weights in the same classes: the same kernels on the same data, so bit-equal
    assert max_diff(_seq2seq(model.eval()).logits, _seq2seq(reference).logits) == 0.0


def test_encoder_decoder_attn_implementation_and_overrides_reach_both_sides(bert2bert_dir):
    _, directory = bert2bert_dir
    model = BertEncoderDecoder.from_pretrained(directory, ["pad_token_id=1"], attn_implementation="eager")
    assert model.encoder.config.encoder.attention.backend.name == "eager"
    assert model.decoder.config.encoder.attention.backend.name == "eager"
    assert model.config.pad_token_id == 1


def test_encoder_decoder_missing_backbone_weights_are_an_error_unless_not_strict(bert2bert_dir):
    _, directory = bert2bert_dir
    state = read_state_dict([directory / "model.safetensors"])
    gone = "decoder.bert.encoder.layer.1.output.dense.weight"
    save_file({k: v.clone() for k, v in state.items() if k != gone}, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=gone):
        BertEncoderDecoder.from_pretrained(directory)
    _, info = BertEncoderDecoder.from_pretrained(directory, strict=False, output_loading_info=True)
    assert info.missing_keys == [gone]


@pytest.mark.parametrize(
    "load",
    [
        lambda d: bertblocks.BertModel.from_pretrained(d, add_pooling_layer=False),
        lambda d: bertblocks.BertForSequenceClassification.from_pretrained(d),
    ],
    ids=["backbone", "task"],
)
def test_unused_and_new_weights_are_reported_in_one_wording(tmp_path, caplog, load):
    torch.manual_seed(0)
    bertblocks.create_model(TINY, head="pretraining").save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        load(tmp_path)
    assert "were not used when initializing" in caplog.text
    assert str(tmp_path) in caplog.text


def test_encoder_decoder_reports_unused_keys_like_the_others(bert2bert_dir, caplog):
    _, directory = bert2bert_dir
    state = read_state_dict([directory / "model.safetensors"])
    state["decoder.cls.seq_relationship.weight"] = torch.zeros(2, 48)
    save_file({k: v.clone() for k, v in state.items()}, str(directory / "model.safetensors"))
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        _, info = BertEncoderDecoder.from_pretrained(directory, output_loading_info=True)
    assert info.unexpected_keys == ["decoder.cls.seq_relationship.weight"]
    assert "Some weights of the checkpoint at" in caplog.text
    assert "were not used when initializing BertEncoderDecoder: decoder.cls.seq_relationship.weight" in caplog.text


# ----------------------------------------------------------------------------------------- the key-map hook
def test_map_checkpoint_keys_applies_the_key_map_then_the_base_prefix():
    t = torch.zeros(1)
    state = {"bert.embeddings.LayerNorm.gamma": t, "cls.x": t}
    assert list(map_checkpoint_keys(state, BERT_KEY_MAP)) == ["bert.embeddings.LayerNorm.weight", "cls.x"]
    backbone = map_checkpoint_keys(state, BERT_KEY_MAP, prefix="bert.", model_has_prefix=False)
    assert list(backbone) == ["embeddings.LayerNorm.weight", "cls.x"]
    bare = {"embeddings.word_embeddings.weight": t}
    task = map_checkpoint_keys(bare, BERT_KEY_MAP, prefix="bert.", model_has_prefix=True)
    assert list(task) == ["bert.embeddings.word_embeddings.weight"]


class _Renamed:
    """A layout that stores the feed-forward output dense as `ffn_out` (a stand-in for a family's key map)."""

    load = SuffixRenames(load={"ffn_out.weight": "output.dense.weight", "ffn_out.bias": "output.dense.bias"})
    save = SuffixRenames(load={"output.dense.weight": "ffn_out.weight", "output.dense.bias": "ffn_out.bias"})

    def to_model(self, state):
        return self.load.to_model(state)

    def to_checkpoint(self, state):
        return self.save.to_model(state)


def test_a_models_key_map_is_used_both_ways(tmp_path, monkeypatch):
    monkeypatch.setattr(bertblocks.BertModel, "checkpoint_key_map", lambda self: _Renamed())
    assert isinstance(_Renamed(), KeyMap)
    torch.manual_seed(0)
    model = bertblocks.create_model(TINY).eval()
    model.save_pretrained(tmp_path)
    stored = read_state_dict([tmp_path / "model.safetensors"])
    assert "encoder.layer.0.ffn_out.weight" in stored
    assert not any(key.endswith("output.dense.weight") and ".attention." not in key for key in stored)
    loaded = bertblocks.BertModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():  # a reload into the same modules: the same kernels on the same data
        assert max_diff(loaded(**batch()).last_hidden_state, model(**batch()).last_hidden_state) == 0.0


def test_the_save_path_round_trips_every_class(tmp_path: Path):
    torch.manual_seed(0)
    for cls in (bertblocks.BertModel, bertblocks.BertForMaskedLM):
        model = bertblocks.create_model(TINY, head=getattr(cls, "head_name", None)).eval()
        model.save_pretrained(tmp_path / cls.__name__)
        loaded, info = cls.from_pretrained(tmp_path / cls.__name__, output_loading_info=True)
        assert info.missing_keys == info.unexpected_keys == []
        assert {k: v.shape for k, v in loaded.state_dict().items()} == {
            k: v.shape for k, v in model.state_dict().items()
        }


def test_create_model_with_pretrained_weights_loads_on_the_meta_device(tmp_path, init_calls):
    small = {"vocab_size": 99, "max_position_embeddings": 32}
    torch.manual_seed(0)
    reference = bertblocks.create_model("bert-tiny-uncased", overrides=small).eval()
    reference.save_pretrained(tmp_path)
    init_calls.clear()
    model = bertblocks.create_model("bert-tiny-uncased", overrides=small, pretrained=tmp_path)
    assert init_calls == []  # every weight came from the checkpoint
    with torch.no_grad():  # the same modules and weights: the same kernels on the same data
        assert max_diff(model(**batch()).last_hidden_state, reference(**batch()).last_hidden_state) == 0.0


def test_an_mlm_head_missing_from_the_checkpoint_starts_as_transformers_does(tmp_path):
    # a sentence encoder's checkpoint has no MLM head: its weights start on the meta device and must all be
    # initialised (the prediction bias, a parameter of the head module itself, was left as raw memory)
    bertblocks.create_model(TINY).save_pretrained(tmp_path)
    model = bertblocks.BertForMaskedLM.from_pretrained(tmp_path)
    assert torch.equal(model.cls.predictions.bias, torch.zeros_like(model.cls.predictions.bias))
    assert torch.isfinite(model(**batch(vocab=model.config.vocab_size)).logits).all()


def test_a_missing_parameter_nothing_knows_how_to_initialise_is_an_error():
    from bertblocks.models.meta_device import deferred_init, materialize

    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = torch.nn.Parameter(torch.ones(4))

    with deferred_init():
        module = torch.nn.Sequential(torch.nn.Linear(4, 4), Scale())
    with pytest.raises(TypeError, match=r"Scale owns parameters \['gain'\].*reset_parameters_like_hf"):
        materialize(module, 0.02)


@pytest.mark.parametrize("deferred", [False, True], ids=["create_model", "from_pretrained (meta device)"])
def test_standard_torch_layers_inside_a_component_are_initialised(deferred):
    """A plugin's nn.Conv1d (ConvBERT's convolution) or nn.GroupNorm needs no subclass: weights as nn.Linear's
    (normal(0, std), zero bias) and as nn.LayerNorm's (one, zero), on the create path and on the meta path."""
    from bertblocks.models.meta_device import deferred_init, materialize
    from bertblocks.models.weight_init import init_weights

    def build() -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Conv1d(64, 64, 3, groups=4), torch.nn.GroupNorm(4, 64), torch.nn.BatchNorm1d(64)
        )

    if deferred:
        with deferred_init():
            module = build()
        materialize(module, 0.2)
    else:
        module = build()
        init_weights(module, 0.2)
    conv, group, batch_norm = module
    assert 0.15 < conv.weight.std().item() < 0.25  # torch's default (kaiming uniform, fan-in 48) would be ~0.08
    assert abs(conv.weight.mean().item()) < 0.05
    assert torch.equal(conv.bias, torch.zeros(64))
    for norm in (group, batch_norm):
        assert torch.equal(norm.weight, torch.ones(64))
        assert torch.equal(norm.bias, torch.zeros(64))
