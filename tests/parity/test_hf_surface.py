"""The transformers model and config surface the HF ecosystem calls, on every model class, each method checked
against transformers' own model on the same (tiny, random) weights."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import transformers
from pydantic import ValidationError

import bertblocks
from bertblocks import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel
from bertblocks.models.surface import parse_size, resolve_dtype
from bertblocks.sentence import minilm_path
from tests.conftest import TINY, batch, max_diff
from tests.tolerances import assert_close, assert_grads_close


def _real(logits: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits at real tokens only: a packed batch leaves zeros at padded positions (docs/explanation/packing.md)."""
    return logits[inputs["attention_mask"].bool()]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("bertblocks").setLevel(logging.ERROR)


def _pair(hf_checkpoint, cls: str, **overrides: object) -> tuple[torch.nn.Module, torch.nn.Module, Path]:
    directory = hf_checkpoint(cls, **overrides)
    ours = getattr(bertblocks, cls).from_pretrained(directory).eval()
    theirs = getattr(transformers, cls).from_pretrained(directory).eval()
    return ours, theirs, directory


# --------------------------------------------------------------------------------------------- reading
@pytest.mark.parametrize("cls", ["BertModel", "BertForMaskedLM", "BertForSequenceClassification"])
def test_device_dtype_and_num_parameters_as_transformers(hf_checkpoint, cls):
    ours, theirs, _ = _pair(hf_checkpoint, cls)
    assert ours.device == theirs.device
    assert ours.dtype == theirs.dtype
    assert ours.num_parameters() == theirs.num_parameters()
    assert ours.num_parameters(exclude_embeddings=True) == theirs.num_parameters(exclude_embeddings=True)
    for p in ours.bert.parameters() if cls != "BertModel" else ours.encoder.parameters():
        p.requires_grad_(False)
    for p in theirs.bert.parameters() if cls != "BertModel" else theirs.encoder.parameters():
        p.requires_grad_(False)
    assert ours.num_parameters(only_trainable=True) == theirs.num_parameters(only_trainable=True)
    assert ours.num_parameters() == sum(p.numel() for p in ours.parameters())


def test_bf16_model_reports_its_dtype():
    model = bertblocks.create_model(TINY).to(torch.bfloat16)
    assert model.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------- from_pretrained
@pytest.mark.parametrize("keyword", ["dtype", "torch_dtype"])
@pytest.mark.parametrize("value", [torch.bfloat16, "bfloat16", "torch.float16"])
def test_from_pretrained_dtype(hf_checkpoint, keyword, value):
    directory = hf_checkpoint("BertForMaskedLM")
    ours = BertForMaskedLM.from_pretrained(directory, **{keyword: value})
    theirs = transformers.BertForMaskedLM.from_pretrained(directory, dtype=resolve_dtype(value))
    assert ours.dtype == theirs.dtype == resolve_dtype(value)
    assert {p.dtype for p in ours.parameters()} == {theirs.dtype}
    theirs_state = theirs.state_dict()
    assert all(torch.equal(v, theirs_state[k]) for k, v in ours.state_dict().items())  # the same cast weights


def test_from_pretrained_auto_dtype_reads_the_checkpoint(hf_checkpoint):
    directory = hf_checkpoint("BertModel")
    config = json.loads((directory / "config.json").read_text())
    config["dtype"] = "float16"
    (directory / "config.json").write_text(json.dumps(config))
    assert BertModel.from_pretrained(directory, dtype="auto").dtype == torch.float16


def test_from_pretrained_bad_dtype_and_unknown_keyword(hf_checkpoint):
    directory = hf_checkpoint("BertModel")
    with pytest.raises(ValueError, match="'int8' is not a floating-point torch dtype"):
        BertModel.from_pretrained(directory, dtype="int8")
    with pytest.raises(ValueError, match="dtype and torch_dtype disagree"):
        BertModel.from_pretrained(directory, dtype="bfloat16", torch_dtype="float16")
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        BertModel.from_pretrained(directory, colour="red")


def test_from_pretrained_takes_config_fields_as_keywords(hf_checkpoint):
    directory = hf_checkpoint("BertModel")
    ours = BertForSequenceClassification.from_pretrained(directory, num_labels=4, classifier_dropout=0.3)
    theirs = transformers.BertForSequenceClassification.from_pretrained(directory, num_labels=4, classifier_dropout=0.3)
    assert ours.config.num_labels == theirs.config.num_labels == 4
    assert ours.dropout.p == theirs.dropout.p == 0.3


def test_num_labels_override_on_minilm_without_label_names():
    """The docstring's own example: all-MiniLM-L6-v2's config.json names no labels."""
    for model in (
        BertForSequenceClassification.from_pretrained(minilm_path(), ["num_labels=3"]),
        BertForSequenceClassification.from_pretrained(minilm_path(), num_labels=3),
    ):
        assert model.config.num_labels == 3
        assert model.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
        assert model.classifier.weight.shape == (3, 384)


def test_num_labels_override_contradicting_real_label_names_is_still_an_error(hf_checkpoint):
    directory = hf_checkpoint("BertForSequenceClassification", id2label={0: "neg", 1: "pos"})
    with pytest.raises(bertblocks.config.ConfigError, match="num_labels: is 3 but id2label names 2 labels"):
        BertForSequenceClassification.from_pretrained(directory, ["num_labels=3"])


# ------------------------------------------------------------------------------------------ embeddings
def test_get_and_set_input_embeddings_retie_the_decoder(hf_checkpoint):
    ours, theirs, _ = _pair(hf_checkpoint, "BertForMaskedLM")
    new = torch.nn.Embedding(99, 32, padding_idx=0)
    torch.nn.init.normal_(new.weight)
    ours.set_input_embeddings(new)
    theirs.set_input_embeddings(torch.nn.Embedding.from_pretrained(new.weight.detach().clone(), freeze=False))
    theirs.tie_weights()
    assert ours.get_input_embeddings() is new
    assert ours.bert.embeddings.word_embeddings is new
    assert ours.get_output_embeddings().weight is new.weight  # tied again
    inputs = batch()
    with torch.no_grad():
        assert_close(_real(ours(**inputs).logits, inputs), _real(theirs(**inputs).logits, inputs))


def test_tie_weights_reties_after_the_decoder_was_untied(hf_checkpoint):
    ours, _, _ = _pair(hf_checkpoint, "BertForMaskedLM")
    ours.cls.predictions.decoder.weight = torch.nn.Parameter(ours.get_input_embeddings().weight.detach().clone())
    assert ours.get_output_embeddings().weight is not ours.get_input_embeddings().weight
    ours.tie_weights()
    assert ours.get_output_embeddings().weight is ours.get_input_embeddings().weight


def test_backbone_has_no_output_embeddings():
    model = bertblocks.create_model(TINY)
    assert model.get_output_embeddings() is None
    with pytest.raises(AttributeError, match="BertModel has no output embeddings"):
        model.set_output_embeddings(torch.nn.Linear(32, 99))


@pytest.mark.parametrize("cls", ["BertModel", "BertForMaskedLM"])
@pytest.mark.parametrize(("size", "multiple"), [(120, None), (50, None), (100, 16)])
def test_resize_token_embeddings_as_transformers(hf_checkpoint, cls, size, multiple):
    ours, theirs, _ = _pair(hf_checkpoint, cls)
    new = ours.resize_token_embeddings(size, pad_to_multiple_of=multiple)
    theirs.resize_token_embeddings(size, pad_to_multiple_of=multiple)
    expected = theirs.get_input_embeddings().weight
    assert new is ours.get_input_embeddings()
    assert new.weight.shape == expected.shape
    assert ours.config.vocab_size == theirs.config.vocab_size == expected.shape[0]
    # kept rows equal; new rows: transformers draws them around the old mean with a 1e-9-scaled covariance
    assert max_diff(new.weight, expected) < 1e-4
    if cls == "BertForMaskedLM":
        assert ours.get_output_embeddings().weight is new.weight
        assert ours.cls.predictions.bias is ours.cls.predictions.decoder.bias
        ids = torch.randint(1, min(size, 99), (2, 7))
        with torch.no_grad():
            ours_logits, theirs_logits = ours(input_ids=ids).logits, theirs(input_ids=ids).logits
        assert ours_logits.shape == theirs_logits.shape
        assert max_diff(ours_logits[..., : min(size, 99)], theirs_logits[..., : min(size, 99)]) < 1e-4
        labels = torch.full_like(ids, -100)
        labels[:, 1] = expected.shape[0] - 1  # a new token is a valid target now
        ours(input_ids=ids, labels=labels).loss.backward()


def test_resize_token_embeddings_rejects_bad_sizes():
    model = bertblocks.create_model(TINY)
    with pytest.raises(ValueError, match="new_num_tokens must be at least 1"):
        model.resize_token_embeddings(0)
    with pytest.raises(ValueError, match="pad_to_multiple_of must be a positive integer"):
        model.resize_token_embeddings(10, pad_to_multiple_of=0)


# ----------------------------------------------------------------------------------- checkpointing
def test_gradient_checkpointing_kwargs_give_the_same_gradients():
    torch.manual_seed(0)
    # checkpointing works in training only
    model = bertblocks.create_model(TINY, head="sequence_classification").train()
    inputs = {**batch(), "labels": torch.tensor([0, 1, 1])}

    def grads() -> list[torch.Tensor]:
        torch.manual_seed(1)  # the same dropout masks (checkpointing replays the RNG state when recomputing)
        model.zero_grad()
        model(**inputs).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    for kwargs in ({"use_reentrant": False}, {"use_reentrant": True}):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        assert model.is_gradient_checkpointing
        assert model.bert.encoder.checkpoint_options == kwargs  # handed on to torch.utils.checkpoint
        for got, want in zip(grads(), plain, strict=True):
            assert_grads_close(got, want)
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    model.activation_checkpointing_enable(every_n_layers=2)
    assert model.bert.encoder.checkpoint_every == 2
    with pytest.raises(ValueError, match="every_n_layers must be at least 1"):
        model.activation_checkpointing_enable(every_n_layers=0)


# ----------------------------------------------------------------------------------------------- saving
@pytest.mark.parametrize("size", ["20KB", 20_000, "0.02MB"])
def test_save_pretrained_max_shard_size_strings_load_in_transformers(tmp_path, size):
    model = bertblocks.create_model(TINY, head="masked_lm").eval()
    model.save_pretrained(tmp_path, max_shard_size=size)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    inputs = batch()
    with torch.no_grad():
        assert_close(_real(model(**inputs).logits, inputs), _real(theirs(**inputs).logits, inputs))


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("1GiB") == 2**30
    assert parse_size("200MB") == 200 * 10**6
    assert parse_size(None) is None
    with pytest.raises(ValueError, match="'lots' is not a size"):
        parse_size("lots")


def test_save_pretrained_with_a_given_state_dict_drops_tied_names(tmp_path):
    """What Trainer, PEFT and accelerate pass: the full state dict, tied names included."""
    model = bertblocks.create_model(TINY, head="masked_lm").eval()
    state = {k: v * 0 + 1 if k.endswith("LayerNorm.bias") else v for k, v in model.state_dict().items()}
    model.save_pretrained(tmp_path, state_dict=state)
    theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path)
    assert torch.equal(theirs.bert.embeddings.LayerNorm.bias, torch.ones(32))
    assert theirs.cls.predictions.decoder.weight is theirs.bert.embeddings.word_embeddings.weight


def test_save_pretrained_off_the_main_process_writes_nothing(tmp_path):
    bertblocks.create_model(TINY).save_pretrained(tmp_path / "x", is_main_process=False)
    assert not (tmp_path / "x").exists()


def test_push_to_hub_offline_fails_clearly(monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    model = bertblocks.create_model(TINY)
    with pytest.raises(Exception, match=r"(?i)offline"):
        model.push_to_hub("someone/tiny-bert")


def test_push_to_hub_uploads_what_save_pretrained_writes(monkeypatch, tmp_path):
    """The upload itself needs the hub; what is handed to it (bertblocks' own step) is checked here."""
    model = bertblocks.create_model(TINY, head="masked_lm")
    uploaded = {}

    def upload(folder, repo_id, **options):
        uploaded.update(repo_id=repo_id, files=sorted(p.name for p in Path(folder).iterdir()), **options)
        uploaded["config"] = json.loads((Path(folder) / "config.json").read_text())
        return "commit"

    monkeypatch.setattr(model, "_upload", upload)
    assert model.push_to_hub("someone/tiny-bert", private=True, max_shard_size="50KB") == "commit"
    model.save_pretrained(tmp_path, max_shard_size="50KB")
    assert uploaded["repo_id"] == "someone/tiny-bert"
    assert uploaded["private"] is True
    assert uploaded["files"] == sorted(p.name for p in tmp_path.iterdir())
    assert uploaded["config"]["architectures"] == ["BertForMaskedLM"]


# ---------------------------------------------------------------------------------------------- config
def test_config_reads_as_transformers_config(hf_checkpoint):
    directory = hf_checkpoint("BertModel")
    ours = bertblocks.load_config(json.loads((directory / "config.json").read_text()))
    theirs = transformers.BertConfig.from_pretrained(directory)
    for name in (
        "model_type",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "attention_probs_dropout_prob",
        "hidden_size",
        "vocab_size",
        "is_encoder_decoder",
        "tie_word_embeddings",
        "use_return_dict",
        "output_hidden_states",
        "num_labels",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
        assert ours.get(name) == getattr(theirs, name), name
    assert ours.get("no_such_key", 7) == 7
    assert "num_hidden_layers" in ours
    mine, theirs_dict = ours.to_dict(), theirs.to_dict()
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size", "model_type"):
        assert mine[key] == theirs_dict[key], key
    assert {int(k): v for k, v in mine["id2label"].items()} == theirs_dict["id2label"]
    assert transformers.BertConfig.from_dict(mine).to_dict()["num_hidden_layers"] == 2
    assert json.loads(ours.to_json_string())["model_type"] == "bert"


def test_config_flat_aliases_write_the_nested_field():
    config = BertConfig()
    config.num_hidden_layers = 4
    config.hidden_act = "relu"
    assert config.encoder.num_layers == 4
    assert config.encoder.feedforward.activation == "relu"


def test_rejected_config_assignment_leaves_the_config_unchanged():
    config = BertConfig(id2label={0: "neg", 1: "pos"})
    before = config.model_dump()
    with pytest.raises(ValidationError, match="is 3 but id2label names 2 labels"):
        config.num_labels = 3  # refused by the whole-config validator, after pydantic stored the value
    with pytest.raises(ValidationError):
        config.hidden_size = -1
    with pytest.raises(ValidationError):
        config.num_hidden_layers = 0
    assert config.model_dump() == before
    assert config.num_labels == 2


def test_num_labels_assignment_with_default_names_renames_them_as_transformers():
    ours, theirs = BertConfig(), transformers.BertConfig()
    ours.num_labels = theirs.num_labels = 3
    assert ours.id2label == theirs.id2label
    assert ours.label2id == theirs.label2id


def test_unknown_config_attribute_is_an_error():
    with pytest.raises(ValidationError, match="no attribute 'colour'"):
        BertConfig().colour = "red"


# --------------------------------------------------------------------------------------- forward extras
def test_task_model_accepts_num_items_in_batch():
    model = bertblocks.create_model(TINY, head="sequence_classification").eval()
    inputs = {**batch(), "labels": torch.tensor([0, 1, 1])}
    # accepted and unused (the mean over 3 items is the default): the same computation, bit-equal
    assert torch.equal(model(**inputs).loss, model(**inputs, num_items_in_batch=torch.tensor(3)).loss)


def test_label_arguments_in_the_signature_are_transformers(hf_checkpoint):
    from transformers.utils.generic import find_labels

    for name in (
        "BertForMaskedLM",
        "BertForSequenceClassification",
        "BertForTokenClassification",
        "BertForQuestionAnswering",
        "BertForPreTraining",
        "BertForMultipleChoice",
    ):
        assert find_labels(getattr(bertblocks, name)) == find_labels(getattr(transformers, name)), name


def test_output_takes_extra_keys_as_transformers_outputs_do():
    model = bertblocks.create_model(TINY, head="masked_lm").eval()
    out = model(**batch())
    out["input_ids"] = batch()["input_ids"]
    assert torch.equal(out["input_ids"], batch()["input_ids"])
    assert out.keys() == ["logits", "input_ids"]
    out["logits"] = out.logits * 0
    assert torch.equal(out.logits, torch.zeros_like(out.logits))


# ----------------------------------------------------------------------------------------- encoder-decoder
def test_encoder_decoder_surface(tmp_path):
    tiny = {**TINY}
    model = bertblocks.create_model({"encoder": tiny, "decoder": tiny, "decoder_start_token_id": 2})
    assert model.config.model_type == "encoder-decoder"
    assert model.config.is_encoder_decoder
    assert model.config.to_dict()["decoder"]["is_decoder"] is True
    assert model.config.get("pad_token_id") == 0
    assert model.get_input_embeddings() is model.encoder.get_input_embeddings()
    assert model.get_output_embeddings() is model.decoder.get_output_embeddings()
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())
    assert model.device.type == "cpu"
    model.gradient_checkpointing_enable()
    assert model.encoder.encoder.gradient_checkpointing
    assert model.decoder.bert.encoder.gradient_checkpointing
    with pytest.raises(NotImplementedError, match=r"call resize_token_embeddings on model\.encoder"):
        model.resize_token_embeddings(120)
    model.save_pretrained(tmp_path, max_shard_size="50KB")
    theirs = transformers.EncoderDecoderModel.from_pretrained(tmp_path).eval()
    model.eval()
    ids = batch()["input_ids"]
    with torch.no_grad():
        assert_close(
            model(input_ids=ids, decoder_input_ids=ids).logits, theirs(input_ids=ids, decoder_input_ids=ids).logits
        )
