"""What only LayoutLM does, beyond its row of tests/families/reference.py (which feeds boxes on every shared path):
the ``bbox`` input on the paths the row does not take (omitted, with ``inputs_embeds``, a packed task model), its
checks (shape, dtype, range, corner order: each a ``BertBlocksError`` naming ``bbox``), the refusal of an input no
embedding declares, and the pooler every LayoutLM task class keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertblocks
from bertblocks.errors import BertBlocksError, InputError, InputTypeError
from tests.families.reference import FAMILIES, LAYOUTLM_GRID, batch, call_inputs, layoutlm_boxes, save_hf
from tests.tolerances import assert_close

FAMILY = FAMILIES["layoutlm"]


def _loaded(tmp_path: Path, cls: str, *overrides: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    reference = save_hf(FAMILY, cls, tmp_path)
    return reference, bertblocks.from_pretrained(tmp_path, list(overrides), head="auto").eval()


def _real(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> None:
    assert_close(a[mask.bool()], b[mask.bool()])


def test_boxes_change_the_numbers_and_omitted_boxes_are_zeros_as_in_transformers(tmp_path):
    reference, ours = _loaded(tmp_path, "LayoutLMModel")
    inputs, mask = batch(FAMILY, "LayoutLMModel")
    inputs = call_inputs("LayoutLMModel", inputs)
    without = {k: v for k, v in inputs.items() if k != "bbox"}
    with torch.no_grad():
        boxed, plain = ours(**inputs).last_hidden_state, ours(**without).last_hidden_state
        _real(plain, reference(**without).last_hidden_state, mask)
        # explicit zeros are what an omitted bbox means
        zeros = ours(**without, bbox=torch.zeros(*inputs["input_ids"].shape, 4, dtype=torch.long)).last_hidden_state
    assert_close(zeros, plain)
    assert (boxed - plain).abs().max() > 1e-3  # the boxes reach the model (the row's parity compares them)


def test_inputs_embeds_take_boxes_too(tmp_path):
    reference, ours = _loaded(tmp_path, "LayoutLMForTokenClassification")
    inputs, mask = batch(FAMILY, "LayoutLMForTokenClassification")
    embeds = ours.get_input_embeddings()(inputs.pop("input_ids")).detach()
    with torch.no_grad():
        want = reference(inputs_embeds=embeds, **inputs)
        got = ours(inputs_embeds=embeds, **inputs)
    _real(got.logits, want.logits, mask)
    assert_close(got.loss, want.loss)


@pytest.mark.parametrize("packing", ["never", "always"])
def test_a_task_model_carries_boxes_into_the_packed_backbone(tmp_path, packing):
    reference, ours = _loaded(tmp_path, "LayoutLMForTokenClassification", f"encoder.packing={packing}")
    inputs, mask = batch(FAMILY, "LayoutLMForTokenClassification")
    with torch.no_grad():
        want, got = reference(**inputs), ours(**inputs, output_hidden_states=True)
    _real(got.logits, want.logits, mask)
    if packing == "always":  # really packed: padded positions of the hidden states hold zeros
        assert got.hidden_states[-1][mask == 0].abs().max() == 0


def test_every_task_class_keeps_the_pooler_as_transformers_does(tmp_path):
    reference, ours = _loaded(tmp_path, "LayoutLMForMaskedLM")
    assert "layoutlm.pooler.dense.weight" in reference.state_dict()
    assert ours.bert.pooler is not None
    assert ours.config.pooler.always
    assert ours.num_parameters() == sum(p.numel() for p in reference.parameters())
    # the same option keeps a BERT token classifier's pooler, and is written to its config.json
    bert = bertblocks.create_model("tiny-bert", {"pooler.always": True, "head": "token_classification"})
    assert bert.bert.pooler is not None
    assert bertblocks.create_model("tiny-bert", {"head": "token_classification"}).bert.pooler is None
    bert.save_pretrained(tmp_path / "bert")
    written = json.loads((tmp_path / "bert" / "config.json").read_text())
    assert written["bertblocks"]["pooler"]["always"] is True


def test_a_config_json_without_the_grid_size_gets_transformers_default(tmp_path):
    hf = FAMILY.hf_config()
    del hf["max_2d_position_embeddings"]
    config = bertblocks.load_config(bertblocks.hf.config_json.config_from_hf(hf))
    assert config.embedding.options()["box_positions"] == 1024


# ------------------------------------------------------------------------------------------------ bad boxes
def _boxes(**change: int) -> torch.Tensor:
    boxes = layoutlm_boxes((2, FAMILY.length))["bbox"]
    for where, value in change.items():
        boxes[1, 4, ["x0", "y0", "x1", "y1"].index(where)] = value
    return boxes


BAD_BOXES = [
    (lambda: _boxes()[:, :, :2], InputError, r"bbox must be \[batch, seq, 4\] = \(2, 9, 4\).*got shape \(2, 9, 2\)"),
    (lambda: _boxes()[:, :5], InputError, r"got shape \(2, 5, 4\)"),
    (lambda: _boxes().float(), InputTypeError, "bbox must be an integer tensor.*torch.float32"),
    (lambda: _boxes(x1=LAYOUTLM_GRID), InputError, f"bbox holds {LAYOUTLM_GRID}, outside.*\\[0, {LAYOUTLM_GRID}\\)"),
    (lambda: _boxes(y0=-1), InputError, "bbox holds -1, outside"),
    (lambda: _boxes(x0=30, x1=10), InputError, r"bbox\[1, 4\] = \[30, .*x0 <= x1"),
    (lambda: _boxes(y0=30, y1=10), InputError, r"bbox\[1, 4\] = .*y0 <= y1"),
    (lambda: [[[0, 0, 1, 1]] * 9] * 2, InputTypeError, "bbox must be a tensor"),
]


@pytest.mark.parametrize(("make", "error", "message"), BAD_BOXES)
def test_a_bad_bbox_is_refused_naming_it(tmp_path, make, error, message):
    model = bertblocks.create_model("tiny-layoutlm", {"embedding.box_positions": LAYOUTLM_GRID}).eval()
    ids = torch.randint(3, 99, (2, FAMILY.length))
    with pytest.raises(error, match=message) as caught:
        model(input_ids=ids, bbox=make())
    assert isinstance(caught.value, BertBlocksError)


def test_an_input_no_embedding_declares_is_refused_naming_what_the_model_takes():
    ids = torch.randint(3, 99, (2, 5))
    boxes = torch.zeros(2, 5, 4, dtype=torch.long)
    with pytest.raises(InputTypeError, match=r"unexpected keyword argument.*bbox") as caught:
        bertblocks.create_model("tiny-bert")(input_ids=ids, bbox=boxes)
    assert "takes" not in str(caught.value)  # BERT's embedding declares nothing beyond BERT's inputs
    with pytest.raises(InputTypeError, match=r"unexpected keyword argument.*lang_ids.*this model takes bbox"):
        bertblocks.create_model("tiny-layoutlm")(input_ids=ids, bbox=boxes, lang_ids=torch.zeros(2))
    # a task model passes extra inputs on to its backbone, where the same door refuses them
    with pytest.raises(InputTypeError, match=r"unexpected keyword argument.*bbox"):
        bertblocks.create_model("tiny-bert", {"head": "token_classification"})(input_ids=ids, bbox=boxes)
