"""Task heads against transformers 5 on the same weights: logits and losses, checkpoint keys both ways, tied
weights, what loading reports, and clear errors for bad labels and inputs."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Head
from bertblocks.core.outputs import SequenceClassifierOutput
from bertblocks.hf.config_json import config_to_hf
from bertblocks.hf.weights import CheckpointError
from bertblocks.registry import BuildError, Registry, set_registry
from tests.conftest import TINY, TINY_HF, batch, to_device
from tests.tolerances import assert_close

B, L, VOCAB = 3, 9, 99


def _lm_labels(inputs):
    """Token ids as targets, -100 at padding (as collators do)."""
    return torch.where(inputs["attention_mask"].bool(), inputs["input_ids"], -100)


def _mlm_labels(inputs):
    labels = _lm_labels(inputs)
    labels[:, ::2] = -100  # half the positions ignored
    return {"labels": labels}


def _inputs(case):
    inputs = batch(11)
    if case == "multiple_choice":  # [b, c, q]: two choices per example, the second with other tokens
        other = batch(12)
        inputs = {k: torch.stack([inputs[k], other[k]], dim=1) for k in inputs}
    return inputs


# case → (transformers class, config overrides, labels for the inputs, output fields to compare)
CASES = {
    "masked_lm": ("BertForMaskedLM", {}, _mlm_labels, ("logits",)),
    "causal_lm": ("BertLMHeadModel", {}, lambda i: {"labels": _lm_labels(i)}, ("logits",)),
    "next_sentence": ("BertForNextSentencePrediction", {}, lambda i: {"labels": torch.tensor([0, 1, 1])}, ("logits",)),
    "pretraining": (
        "BertForPreTraining",
        {},
        lambda i: {**_mlm_labels(i), "next_sentence_label": torch.tensor([1, 0, 1])},
        ("prediction_logits", "seq_relationship_logits"),
    ),
    "single_label": (
        "BertForSequenceClassification",
        {"num_labels": 3},
        lambda i: {"labels": torch.tensor([2, 0, 1])},
        ("logits",),
    ),
    "regression": (
        "BertForSequenceClassification",
        {"num_labels": 1},
        lambda i: {"labels": torch.tensor([0.5, -1.0, 2.0])},
        ("logits",),
    ),
    "multi_label": (
        "BertForSequenceClassification",
        {"num_labels": 3},
        lambda i: {"labels": torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])},
        ("logits",),
    ),
    "token_classification": (
        "BertForTokenClassification",
        {"num_labels": 5},
        lambda i: {"labels": torch.where(i["attention_mask"].bool(), i["input_ids"] % 5, -100)},
        ("logits",),
    ),
    "question_answering": (
        "BertForQuestionAnswering",
        {},
        # 50 is past the end: clamped to seq_len and ignored, as HF does
        lambda i: {"start_positions": torch.tensor([1, 50, 3]), "end_positions": torch.tensor([[4], [6], [3]])},
        ("start_logits", "end_logits"),
    ),
    "multiple_choice": ("BertForMultipleChoice", {}, lambda i: {"labels": torch.tensor([1, 0, 1])}, ("logits",)),
}
AUTO = {
    "BertForMaskedLM": "AutoModelForMaskedLM",
    "BertLMHeadModel": "AutoModelForCausalLM",
    "BertForNextSentencePrediction": "AutoModelForNextSentencePrediction",
    "BertForPreTraining": "AutoModelForPreTraining",
    "BertForSequenceClassification": "AutoModelForSequenceClassification",
    "BertForTokenClassification": "AutoModelForTokenClassification",
    "BertForQuestionAnswering": "AutoModelForQuestionAnswering",
    "BertForMultipleChoice": "AutoModelForMultipleChoice",
}


@pytest.fixture(autouse=True)
def _quiet_transformers():
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _run(model, case, device="cpu"):
    inputs = _inputs(case)
    labels = CASES[case][2](inputs)
    inputs, labels = to_device(inputs, device), to_device(labels, device)
    with torch.no_grad():
        return model(**inputs, **labels), model(**inputs)


# ------------------------------------------------------------------------------------ parity with HF 5
# Exact parity at every position needs `encoder.packing=never`: HF computes real values at padded positions.
# With the default packing (`auto`, inference only) padded positions hold zeros, so there real positions and
# the losses are compared; QA, whose softmax reads padded positions too, turns automatic packing off.
NEVER_PACK = ["encoder.packing=never"]


def _real(tensor, mask):
    """The rows of a per-token output ``[b, q, ...]`` at real (unpadded) positions."""
    return tensor[mask.bool()] if tensor.dim() >= 2 and tensor.shape[:2] == mask.shape else tensor


@pytest.mark.parametrize("case", list(CASES))
def test_head_matches_transformers(hf_checkpoint, case, device):
    cls_name, overrides, _, fields = CASES[case]
    directory = hf_checkpoint(cls_name, **overrides)
    hf = getattr(transformers, cls_name).from_pretrained(directory).to(device).eval()
    ours, info = getattr(bertblocks, cls_name).from_pretrained(directory, NEVER_PACK, output_loading_info=True)
    assert not info.missing_keys
    assert not info.unexpected_keys
    assert not info.mismatched_keys
    assert list(ours.state_dict()) == list(hf.state_dict())  # HF's keys, HF's order
    ours.to(device).eval()
    (theirs, theirs_plain), (mine, mine_plain) = _run(hf, case, device), _run(ours, case, device)
    for field in fields:
        assert_close(mine[field], theirs[field], what=field)
        assert_close(mine_plain[field], theirs_plain[field], what=field)
    assert_close(mine.loss, theirs.loss)
    assert mine_plain.loss is None
    assert list(mine.keys()) == list(theirs.keys())  # same fields, same order
    assert ours.config.problem_type == hf.config.problem_type  # inferred and written back as HF does

    # the default config (packing `auto`): real positions and losses that ignore padding still match
    packed = getattr(bertblocks, cls_name).from_pretrained(directory).to(device).eval()
    assert packed.config.encoder.packing == "auto"
    mask = _inputs(case)["attention_mask"].to(device)
    default, _ = _run(packed, case, device)
    for field in fields:
        assert_close(_real(default[field], mask), _real(theirs[field], mask), what=field)
    assert_close(default.loss, theirs.loss)
    assert (packed.bert.auto_packing_limit is None) == (case != "question_answering")


@pytest.mark.parametrize("case", ["masked_lm", "single_label", "multiple_choice"])
def test_hidden_states_attentions_and_tuples_as_transformers(hf_checkpoint, case):
    cls_name, overrides, make_labels, _ = CASES[case]
    directory = hf_checkpoint(cls_name, **overrides)
    hf = getattr(transformers, cls_name).from_pretrained(directory, attn_implementation="eager").eval()
    ours = getattr(bertblocks, cls_name).from_pretrained(directory, NEVER_PACK, attn_implementation="eager").eval()
    inputs = _inputs(case)
    labels = make_labels(inputs)
    with torch.no_grad():
        theirs = hf(**inputs, **labels, output_hidden_states=True, output_attentions=True)
        mine = ours(**inputs, **labels, output_hidden_states=True, output_attentions=True)
        as_tuple = ours(**inputs, **labels, return_dict=False)
    assert len(mine.hidden_states) == len(theirs.hidden_states) == 3
    for a, b in zip(mine.hidden_states + mine.attentions, theirs.hidden_states + theirs.attentions, strict=True):
        assert_close(a, b)
    assert isinstance(as_tuple, tuple)
    assert len(as_tuple) == 2
    assert torch.equal(as_tuple[0], mine.loss)


# ------------------------------------------------------------------------------------ saving / loading
@pytest.mark.parametrize("case", list(CASES))
def test_saved_by_bertblocks_loads_in_transformers_auto_class(tmp_path, case):
    cls_name, overrides, _, fields = CASES[case]
    torch.manual_seed(5)
    config = {**TINY, "initializer_range": 0.2, **overrides}
    ours = bertblocks.create_model(config, NEVER_PACK, head=getattr(bertblocks, cls_name).head_name).eval()
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [cls_name]
    hf, info = getattr(transformers, AUTO[cls_name]).from_pretrained(tmp_path, output_loading_info=True)
    assert type(hf).__name__ == cls_name
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    (theirs, _), (mine, _) = _run(hf.eval(), case), _run(ours, case)
    for field in fields:
        assert_close(mine[field], theirs[field], what=field)
    assert_close(mine.loss, theirs.loss)


def test_tied_decoder_is_the_embedding_table_and_is_not_saved(tmp_path, hf_checkpoint):
    model = bertblocks.create_model({**TINY}, head="masked_lm")
    decoder = model.cls.predictions.decoder
    assert decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert decoder.bias is model.cls.predictions.bias
    params = list(model.parameters())
    assert len(params) == len({id(p) for p in params})
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY_HF))
    assert model.num_parameters() == sum(p.numel() for p in hf.parameters())
    model.save_pretrained(tmp_path / "ours")
    hf.save_pretrained(tmp_path / "hf")
    ours_keys = set(load_file(tmp_path / "ours" / "model.safetensors"))
    assert ours_keys == set(load_file(tmp_path / "hf" / "model.safetensors"))
    assert len(ours_keys) == len(model.state_dict()) - 2  # HF: 44 -> 42 for bert-base's layer count
    # the tie survives loading, and an optimiser step moves both names together
    loaded = bertblocks.BertForMaskedLM.from_pretrained(tmp_path / "ours")
    assert loaded.cls.predictions.decoder.weight is loaded.bert.embeddings.word_embeddings.weight
    assert loaded.cls.predictions.decoder.bias is loaded.cls.predictions.bias


def test_untied_decoder_has_its_own_weights_and_round_trips(tmp_path):
    torch.manual_seed(6)
    ours = bertblocks.create_model({**TINY, "tie_word_embeddings": False}, NEVER_PACK, head="masked_lm").eval()
    decoder = ours.cls.predictions.decoder
    assert decoder.weight is not ours.bert.embeddings.word_embeddings.weight
    assert decoder.bias is not ours.cls.predictions.bias  # as transformers 5 unties both
    ours.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "cls.predictions.decoder.weight" in saved
    assert "cls.predictions.decoder.bias" in saved
    hf, info = transformers.BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert hf.config.tie_word_embeddings is False
    (theirs, _), (mine, _) = _run(hf.eval(), "masked_lm"), _run(ours, "masked_lm")
    assert_close(mine.logits, theirs.logits)


def test_legacy_google_checkpoint_gamma_beta_without_decoder_bias(hf_checkpoint, tmp_path):
    """Old conversions: LayerNorm.gamma/beta, a stored decoder weight, a stale position_ids buffer, and no
    cls.predictions.decoder.bias (transformers #11809)."""
    directory = hf_checkpoint("BertForPreTraining")
    hf = transformers.BertForPreTraining.from_pretrained(directory).eval()
    state = load_file(directory / "model.safetensors")
    legacy = {}
    for key, tensor in state.items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        legacy[key] = tensor
    legacy["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
    legacy["bert.embeddings.position_ids"] = torch.arange(64)[None]
    assert "cls.predictions.decoder.bias" not in legacy
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    save_file(legacy, str(tmp_path / "model.safetensors"))
    ours, info = bertblocks.from_pretrained(tmp_path, NEVER_PACK, head="auto", output_loading_info=True)
    assert isinstance(ours, bertblocks.BertForPreTraining)
    assert not info.missing_keys
    assert not info.unexpected_keys
    assert sorted(info.ignored_keys) == ["bert.embeddings.position_ids", "cls.predictions.decoder.weight"]
    (theirs, _), (mine, _) = _run(hf, "pretraining"), _run(ours.eval(), "pretraining")
    assert_close(mine.prediction_logits, theirs.prediction_logits)


def test_backbone_checkpoint_into_head_reports_new_head_weights_as_transformers(hf_checkpoint, caplog):
    directory = hf_checkpoint("BertModel")
    for cls_name in ("BertForSequenceClassification", "BertForMaskedLM"):
        _, hf_info = getattr(transformers, cls_name).from_pretrained(directory, output_loading_info=True)
        with caplog.at_level(logging.WARNING, logger="bertblocks"):
            caplog.clear()
            _ours, info = getattr(bertblocks, cls_name).from_pretrained(directory, output_loading_info=True)
        # transformers also lists the tied alias cls.predictions.decoder.bias; we list each parameter once,
        # under the name that is stored (cls.predictions.bias)
        assert set(info.missing_keys) == set(hf_info["missing_keys"]) - {"cls.predictions.decoder.bias"}, cls_name
        # transformers names unused keys of a backbone checkpoint as stored (`pooler.…`); we name them where the
        # model would have put them (`bert.pooler.…`)
        assert {k.removeprefix("bert.") for k in info.unexpected_keys} == set(hf_info["unexpected_keys"]), cls_name
        assert info.missing_keys
        message = caplog.text
        assert "newly initialized" in message
        assert all(key in message for key in info.missing_keys)
    assert sorted(info.unexpected_keys) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]  # MLM: no pooler


def test_pretraining_checkpoint_into_classifier_reports_unused_keys(hf_checkpoint, caplog):
    directory = hf_checkpoint("BertForPreTraining")
    _, hf_info = transformers.BertForSequenceClassification.from_pretrained(directory, output_loading_info=True)
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        ours, info = bertblocks.BertForSequenceClassification.from_pretrained(directory, output_loading_info=True)
    assert ours.config.head.name == "sequence_classification"  # the class decides, not `architectures`
    assert sorted(info.missing_keys) == ["classifier.bias", "classifier.weight"]
    assert set(info.unexpected_keys) == set(hf_info["unexpected_keys"])
    assert "cls.seq_relationship.weight" in info.unexpected_keys
    assert "were not used" in caplog.text
    assert all(key in caplog.text for key in info.unexpected_keys)
    # and the backbone loaded: same pooled features as transformers' model
    hf = transformers.BertForPreTraining.from_pretrained(directory).eval()
    inputs = batch(13)
    with torch.no_grad():
        assert_close(ours.eval().bert(**inputs).pooler_output, hf.bert(**inputs).pooler_output)


def test_missing_backbone_weight_in_task_checkpoint_is_an_error(hf_checkpoint, tmp_path):
    directory = hf_checkpoint("BertForTokenClassification", num_labels=5)
    state = load_file(directory / "model.safetensors")
    del state["bert.encoder.layer.1.output.dense.weight"]
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint: bert\.encoder\.layer\.1\.output\.dense"):
        bertblocks.BertForTokenClassification.from_pretrained(tmp_path)
    _, info = bertblocks.BertForTokenClassification.from_pretrained(tmp_path, strict=False, output_loading_info=True)
    assert info.missing_keys == ["bert.encoder.layer.1.output.dense.weight"]


def test_from_pretrained_head_argument(hf_checkpoint):
    directory = hf_checkpoint("BertForMaskedLM")
    assert type(bertblocks.from_pretrained(directory)) is bertblocks.BertModel  # default: the backbone
    assert isinstance(bertblocks.from_pretrained(directory, head="auto"), bertblocks.BertForMaskedLM)
    qa = bertblocks.from_pretrained(directory, head="question_answering")
    assert isinstance(qa, bertblocks.BertForQuestionAnswering)
    generic = bertblocks.BertTaskModel.from_pretrained(directory)  # the head architectures names
    assert isinstance(generic, bertblocks.BertForMaskedLM)
    backbone_dir = hf_checkpoint("BertModel", seed=1)
    assert type(bertblocks.from_pretrained(backbone_dir, head="auto")) is bertblocks.BertModel
    with pytest.raises(BuildError, match="no head"):
        bertblocks.BertTaskModel.from_pretrained(backbone_dir)


def test_labels_metadata_round_trips(tmp_path):
    id2label = {0: "negative", 1: "neutral", 2: "positive"}
    ours = bertblocks.create_model({**TINY, "id2label": id2label}, head="sequence_classification")
    assert ours.config.num_labels == 3
    assert ours.classifier.out_features == 3
    ours.save_pretrained(tmp_path)
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    assert hf.config.id2label == id2label
    assert hf.config.label2id == {v: k for k, v in id2label.items()}
    again = bertblocks.BertForSequenceClassification.from_pretrained(tmp_path)
    assert again.config.id2label == id2label
    assert again.config.label2id == {v: k for k, v in id2label.items()}


def test_inferred_problem_type_is_saved(tmp_path):
    model = bertblocks.create_model({**TINY, "num_labels": 3}, head="sequence_classification")
    assert model.config.problem_type is None
    model(**batch(14), labels=torch.tensor([[1.0, 0.0, 0.0]] * 3))
    assert model.config.problem_type == "multi_label_classification"
    model.save_pretrained(tmp_path)
    assert transformers.AutoConfig.from_pretrained(tmp_path).problem_type == "multi_label_classification"
    # the config is the truth: changing it changes the loss the next call computes
    model.config.problem_type = "single_label_classification"
    out = model(**batch(14), labels=torch.tensor([0, 1, 2]))
    assert out.loss is not None


def test_config_architectures_name_the_head_and_the_backbone_ignores_it(tmp_path):
    config = bertblocks.load_config({**TINY_HF, "architectures": ["BertForTokenClassification"]})
    assert config.head is not None
    assert config.head.name == "token_classification"
    assert config_to_hf(config)["architectures"] == ["BertForTokenClassification"]
    assert "bertblocks" not in config_to_hf(config)  # the head travels in `architectures`
    backbone = bertblocks.create_model(config, {"head": None})  # the backbone alone
    assert not hasattr(backbone, "classifier")
    backbone.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertModel"]


def test_dropout_uses_classifier_dropout_or_else_hidden_dropout():
    explicit = bertblocks.create_model({**TINY, "classifier_dropout": 0.3}, head="sequence_classification")
    fallback = bertblocks.create_model({**TINY, "hidden_dropout_prob": 0.2}, head="token_classification")
    assert explicit.dropout.p == 0.3
    assert fallback.dropout.p == 0.2


# ------------------------------------------------------------------------------------ third-party head
class _MeanRegressionHead(Head):
    """A plugin head: regression on the mean of the last hidden state."""

    label_names = ("labels",)

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.regressor = torch.nn.Linear(hidden_size, 1)

    def forward(self, output, labels, batch_shape, *, attention_mask):
        logits = self.regressor(output.last_hidden_state.mean(dim=1))
        loss = torch.nn.functional.mse_loss(logits.squeeze(-1), labels["labels"]) if labels else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


class _Plugin:
    @staticmethod
    def bertblocks_register_components():
        return [
            Component("head", "mean_regression", lambda *, hidden_size, options, **_: _MeanRegressionHead(hidden_size))
        ]


def test_third_party_head_builds_saves_and_reloads(tmp_path):
    registry = Registry(load_entry_points=False)
    registry.register(_Plugin(), name="mean-head")
    set_registry(registry)
    torch.manual_seed(7)
    model = bertblocks.create_model({**TINY, "head": "mean_regression"}).eval()
    assert type(model) is bertblocks.BertTaskModel
    assert model.bert.pooler is None  # the head does not read the pooled output
    assert [k for k in model.state_dict() if not k.startswith("bert.")] == ["regressor.weight", "regressor.bias"]
    out = model(**batch(15), labels=torch.tensor([0.1, 0.2, 0.3]))
    assert out.loss is not None
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["BertModel"]  # transformers has no class for it
    assert saved["bertblocks"]["head"]["name"] == "mean_regression"
    again = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    with torch.no_grad():
        # loaded tensors are the checkpoint's own buffers (other alignment, so other GEMM paths): fp32 parity
        assert_close(again(**batch(15)).logits, model(**batch(15)).logits)


# ----------------------------------------------------------------------------------------- bad input
def _model(cls_name, **config):
    return bertblocks.create_model({**TINY, **config}, head=getattr(bertblocks, cls_name).head_name).eval()


@pytest.mark.parametrize(
    ("cls_name", "config", "labels", "message"),
    [
        (
            "BertForMaskedLM",
            {},
            {"labels": torch.zeros(B, L)},
            r"labels must be an integer tensor .*got dtype torch.float32",
        ),
        ("BertForMaskedLM", {}, {"labels": torch.zeros(B, dtype=torch.long)}, r"labels must have shape \(3, 9\)"),
        ("BertForMaskedLM", {}, {"labels": torch.full((B, L), 120)}, r"labels hold 120, outside \[0, 99\)"),
        ("BertLMHeadModel", {}, {"labels": torch.zeros(B, L + 1, dtype=torch.long)}, r"must have shape \(3, 9\)"),
        (
            "BertForSequenceClassification",
            {"num_labels": 3},
            {"labels": torch.zeros(B, 3, dtype=torch.long)},
            r"labels must have shape \(3,\) or \(3, 1\) \(one class index",
        ),
        (
            "BertForSequenceClassification",
            {"num_labels": 3},
            {"labels": torch.tensor([0, 1, 3])},
            r"labels hold 3, outside \[0, 3\)",
        ),
        (
            "BertForSequenceClassification",
            {"num_labels": 1},
            {"labels": torch.tensor([0, 1, 1])},
            r"labels must be a floating-point tensor \(regression",
        ),
        (
            "BertForSequenceClassification",
            {"num_labels": 3, "problem_type": "multi_label_classification"},
            {"labels": torch.tensor([0, 1, 2])},
            r"floating-point tensor \(multi-label",
        ),
        (
            "BertForSequenceClassification",
            {"num_labels": 3},
            {"labels": torch.tensor([0.0, 1.0, 1.0])},  # float, one per example: HF infers multi-label
            r"labels must have shape \(3, 3\) \(multi-label",
        ),
        ("BertForTokenClassification", {}, {"labels": torch.zeros(B, L, 1, dtype=torch.long)}, r"shape \(3, 9\)"),
        ("BertForNextSentencePrediction", {}, {"labels": torch.tensor([0, 2, 1])}, r"labels hold 2, outside \[0, 2\)"),
        (
            "BertForQuestionAnswering",
            {},
            {"start_positions": torch.zeros(B, 2, dtype=torch.long), "end_positions": torch.zeros(B, dtype=torch.long)},
            r"start_positions must have shape \(3,\) or \(3, 1\)",
        ),
        (
            "BertForQuestionAnswering",
            {},
            {"start_positions": torch.zeros(B), "end_positions": torch.zeros(B)},
            r"start_positions must be an integer tensor",
        ),
        (
            "BertForQuestionAnswering",
            {},
            {"start_positions": torch.zeros(B, dtype=torch.long)},
            "needs both start_positions and end_positions; only start_positions",
        ),
        ("BertForPreTraining", {}, {"labels": torch.zeros(B, L, dtype=torch.long)}, "needs both labels and next_sen"),
        (
            "BertForMaskedLM",
            {},
            {"start_positions": torch.zeros(B, dtype=torch.long)},
            r"BertForMaskedLM \(masked_lm head\) takes labels; got start_positions",
        ),
    ],
)
def test_bad_labels_are_clear_errors(cls_name, config, labels, message):
    model = _model(cls_name, **config)
    with pytest.raises(ValueError, match=message):
        model(**batch(16), **labels)


def test_multiple_choice_needs_three_d_inputs():
    model = _model("BertForMultipleChoice")
    two_d = batch(17)
    with pytest.raises(ValueError, match=r"input_ids must be 3-D \[batch, num_choices, seq\]; got shape \(3, 9\)"):
        model(**two_d)
    three_d = _inputs("multiple_choice")
    with pytest.raises(ValueError, match=r"attention_mask must have the input's shape \(3, 2, 9\)"):
        model(input_ids=three_d["input_ids"], attention_mask=two_d["attention_mask"])
    with pytest.raises(ValueError, match=r"inputs_embeds must be 4-D"):
        model(inputs_embeds=torch.zeros(3, 9, 32))
    with pytest.raises(ValueError, match=r"labels hold 2, outside \[0, 2\)"):
        model(**three_d, labels=torch.tensor([0, 2, 1]))
    # inputs_embeds [b, c, q, H] is flattened like input_ids
    out = model(inputs_embeds=torch.randn(3, 2, 9, 32), labels=torch.tensor([0, 1, 1]))
    assert out.logits.shape == (3, 2)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"num_labels: is 3 but id2label names 2 labels"):
        bertblocks.create_model({**TINY, "num_labels": 3, "id2label": {0: "a", 1: "b"}}, head="sequence_classification")
    with pytest.raises(ConfigError, match=r"head: unknown head 'masked_ml'.*did you mean 'masked_lm'"):
        bertblocks.create_model({**TINY, "head": "masked_ml"})
    with pytest.raises(ConfigError, match=r"head.tie: unknown field"):
        bertblocks.create_model({**TINY, "head": {"name": "masked_lm", "tie": False}})


def test_build_errors_are_clear(tmp_path):
    with pytest.raises(BuildError, match=r"question_answering head needs num_labels = 2.*num_labels = 3"):
        bertblocks.create_model({**TINY, "num_labels": 3}, head="question_answering")
    with pytest.raises(BuildError, match=r"'sequence_classification' head reads the pooled output.*pooler: null"):
        bertblocks.create_model({**TINY, "pooler": None}, head="sequence_classification")
    bertblocks.create_model(TINY).save_pretrained(tmp_path)
    with pytest.raises(BuildError, match="BertForMaskedLM always has the 'masked_lm' head"):
        bertblocks.BertForMaskedLM.from_pretrained(tmp_path, head="sequence_classification")
