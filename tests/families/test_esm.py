"""ESM-1b / ESM-2 (``esm``): parity both ways with transformers' own classes on tiny checkpoints they saved, for the
backbone and every head; token dropout in evaluation and training; padded positions; the stored inverse
frequencies (transformers 5's one key and the older per-layer copies); ``inputs_embeds``; what is refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.config.errors import ConfigError
from bertblocks.errors import BertBlocksError
from bertblocks.hf.config_json import config_from_hf
from tests.families.reference import COMMON, TOL, Family, batch, round_trip, save_hf

MASK = 4  # the mask token of the tiny vocabulary; the batches below put it in every row
#: ESM-2's settings at test size (rotary positions, token dropout, no LayerNorm before the stack)
ESM2: dict[str, Any] = {
    **COMMON,
    "pad_token_id": 1,
    "mask_token_id": MASK,
    "position_embedding_type": "rotary",
    "token_dropout": True,
    "emb_layer_norm_before": False,
    "rope_theta": 50.0,  # far from the default, so that a base read wrongly changes the numbers
}
ESM = Family("EsmConfig", ESM2, pad=1, token_types=False)
CLASSES = ("EsmModel", "EsmForMaskedLM", "EsmForSequenceClassification", "EsmForTokenClassification")
VARIANTS: dict[str, dict[str, Any]] = {
    # ESM-1b: a learned table with positions past the padding index, a LayerNorm before the stack
    "esm-1b": {"position_embedding_type": "absolute", "emb_layer_norm_before": True},
    "no-token-dropout": {"token_dropout": False},
}


def _masked_batch(cls: str = "EsmModel") -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """:func:`batch` with mask tokens in both rows (two in the padded one), so that token dropout rescales."""
    inputs, mask = batch(ESM, cls)
    inputs["input_ids"][0, 2] = MASK
    inputs["input_ids"][1, 1] = MASK
    inputs["input_ids"][1, 3] = MASK
    return inputs, mask


@pytest.mark.parametrize("cls", CLASSES)
def test_matches_transformers_both_ways(tmp_path, cls):
    inputs, mask = _masked_batch(cls)
    round_trip(tmp_path, ESM, cls, inputs, mask)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cls", ["EsmModel", "EsmForMaskedLM"])
def test_variants_match_transformers_both_ways(tmp_path, variant, cls):
    inputs, mask = _masked_batch(cls)
    round_trip(tmp_path, ESM, cls, inputs, mask, **VARIANTS[variant])


@pytest.mark.parametrize("training", [False, True])
def test_token_dropout_and_padding_every_position(tmp_path, training):
    """Every position (padding too: ESM zeroes padded embeddings) and every hidden state, in evaluation and in
    training (token dropout rescales in both; dropout probabilities 0 so that the runs are comparable)."""
    reference = save_hf(ESM, "EsmForMaskedLM", tmp_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = bertblocks.from_pretrained(tmp_path, head="auto")
    inputs, _ = _masked_batch("EsmForMaskedLM")
    reference.train(training)
    ours.train(training)
    expected = reference(**inputs, output_hidden_states=True)
    got = ours(**inputs, output_hidden_states=True)
    assert (expected.logits - got.logits).abs().max().item() <= TOL
    assert (expected.loss - got.loss).abs().item() <= TOL
    assert len(expected.hidden_states) == len(got.hidden_states)
    for a, b in zip(expected.hidden_states, got.hidden_states, strict=True):
        assert (a - b).abs().max().item() <= TOL
    expected.loss.backward()
    got.loss.backward()
    a = reference.esm.embeddings.word_embeddings.weight.grad
    b = ours.bert.embeddings.word_embeddings.weight.grad
    assert (a - b).abs().max().item() <= TOL


def test_token_dropout_changes_the_numbers(tmp_path):
    """The rescaling is there: the same weights without token_dropout give other numbers (so the tests above
    would see it missing)."""
    save_hf(ESM, "EsmModel", tmp_path)
    inputs, mask = _masked_batch()
    with torch.no_grad():
        on = bertblocks.from_pretrained(tmp_path).eval()(**inputs).last_hidden_state
        off = bertblocks.from_pretrained(tmp_path, ["embedding.token_dropout=false"]).eval()(**inputs)
    assert (on - off.last_hidden_state)[mask.bool()].abs().max().item() > 1e-3


def test_inputs_embeds_skip_the_embeddings(tmp_path):
    reference = save_hf(ESM, "EsmModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    inputs, mask = _masked_batch()
    embeds = torch.randn(*inputs["input_ids"].shape, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = reference(inputs_embeds=embeds, attention_mask=inputs["attention_mask"]).last_hidden_state
        got = ours(inputs_embeds=embeds, attention_mask=inputs["attention_mask"]).last_hidden_state
    assert (expected - got)[mask.bool()].abs().max().item() <= TOL


def test_the_packed_path_gives_transformers_numbers(tmp_path):
    reference = save_hf(ESM, "EsmModel", tmp_path)
    inputs, mask = _masked_batch()
    ours = bertblocks.from_pretrained(tmp_path, ["encoder.packing=always"]).eval()
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state[mask.bool()]
        got = ours(**inputs).last_hidden_state[mask.bool()]
    assert (expected - got).abs().max().item() <= TOL


def test_stored_inverse_frequencies_are_read_in_both_layouts(tmp_path):
    """Per-layer copies (older checkpoints) load from layer 0, as transformers' load hook does; values that differ
    from the formula are the ones used, by both."""
    save_hf(ESM, "EsmModel", tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (shared,) = [k for k in state if k.endswith("inv_freq")]
    assert shared == "encoder.layer.*.attention.self.rotary_embeddings.inv_freq"  # transformers 5's own key
    value = state.pop(shared) * 0.9
    for i in range(2):
        state[f"encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq"] = value.clone()
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    reference = transformers.EsmModel.from_pretrained(tmp_path).eval()
    ours, info = bertblocks.from_pretrained(tmp_path, output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    assert torch.equal(ours.encoder.rotary_embeddings.inv_freq, value)
    inputs, mask = _masked_batch()
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state[mask.bool()]
        got = ours.eval()(**inputs).last_hidden_state[mask.bool()]
    assert (expected - got).abs().max().item() <= TOL


def test_the_contact_head_weights_round_trip_frozen(tmp_path):
    save_hf(ESM, "EsmForMaskedLM", tmp_path / "hf")
    state = load_file(tmp_path / "hf" / "model.safetensors")
    ours = bertblocks.from_pretrained(tmp_path / "hf", head="auto")
    regression = ours.bert.embeddings.contact_head.regression
    assert torch.equal(regression.weight, state["esm.contact_head.regression.weight"])
    assert not regression.weight.requires_grad  # never run: no unused trainable parameter (DDP)
    ours.save_pretrained(tmp_path / "ours")
    again = load_file(tmp_path / "ours" / "model.safetensors")
    assert torch.equal(again["esm.contact_head.regression.weight"], state["esm.contact_head.regression.weight"])


@pytest.mark.parametrize(("field", "value"), [("is_folding_model", True), ("position_embedding_type", "relative_key")])
def test_what_is_not_built_is_refused_by_name(field, value):
    hf = ESM.hf_config(**{field: value})
    with pytest.raises((ConfigError, BertBlocksError), match=field):
        config_from_hf(hf)


def test_a_three_dimensional_mask_is_refused_naming_the_shape(tmp_path):
    save_hf(ESM, "EsmModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    ids = torch.randint(5, 99, (2, 6))
    with pytest.raises(ValueError, match="2-D attention_mask"):
        ours(input_ids=ids, attention_mask=torch.ones(2, 6, 6, dtype=torch.long))


def test_token_dropout_without_a_mask_token_is_refused():
    with pytest.raises(BertBlocksError, match="mask_token_id"):
        bertblocks.create_model("tiny-esm", ["embedding.mask_token_id=null"])


def test_a_contact_head_of_another_depth_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="contact_head_features 8 must be num_layers × num_heads = 3 × 4"):
        bertblocks.create_model("tiny-esm", ["encoder.num_layers=3"])
    bertblocks.create_model("tiny-esm", ["encoder.num_layers=3", "embedding.contact_head_features=12"])
