"""Parity with transformers 4.46.3 for what transformers 5 removed: relative positions, head_mask, pruning.

The expected tensors were computed by ``tests/fixtures/v4/make_fixtures.py`` with transformers 4.46.3 (eager
attention, fp32, eval mode) on the checkpoints stored beside them.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import bertblocks
from tests.conftest import V4
from tests.tolerances import assert_close, assert_identical

ENCODER_CASES = [
    "absolute",
    "relative_key",
    "relative_key_query",
    "head_mask_absolute",
    "head_mask_relative_key",
    "pruned",
    "pruned_relative_key",
]


def _check(out, io, suffix="", real=None):
    """All positions, or with ``real`` ([b, L] bool) real tokens only (a packed run zeroes padded ones)."""

    def pick(t, rows=False):
        if real is None:
            return t
        return t.transpose(1, 2)[real] if rows else t[real]

    assert_close(pick(out.last_hidden_state), pick(io[f"last_hidden_state{suffix}"]))
    assert_close(out.pooler_output, io[f"pooler_output{suffix}"])
    for i, hidden in enumerate(out.hidden_states):
        assert_close(pick(hidden), pick(io[f"hidden_states_{i}{suffix}"]))
    for i, attention in enumerate(out.attentions):
        assert_close(pick(attention, True), pick(io[f"attentions_{i}{suffix}"], True))


@pytest.mark.parametrize("packing", ["never", "always"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("case", ENCODER_CASES)
def test_encoder_matches_transformers_4(case, backend, packing):
    io = load_file(V4 / case / "io.safetensors")
    model = bertblocks.from_pretrained(V4 / case, [f"encoder.packing={packing}"], attn_implementation=backend).eval()
    inputs = {k: io[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    real = inputs["attention_mask"].bool() if packing == "always" else None
    if "head_mask" in io:
        inputs["head_mask"] = io["head_mask"]
    with torch.no_grad():
        _check(model(**inputs, output_hidden_states=True, output_attentions=True), io, real=real)
        # the fused path (no attention maps asked for) gives the same numbers
        fused = model(**inputs)
    pick = (lambda t: t) if real is None else (lambda t: t[real])
    assert_close(pick(fused.last_hidden_state), pick(io["last_hidden_state"]))
    if "head_mask_1d" in io:
        inputs["head_mask"] = io["head_mask_1d"]
        with torch.no_grad():
            _check(model(**inputs, output_hidden_states=True, output_attentions=True), io, "_1d", real=real)


@pytest.mark.parametrize("case", ["relative_key", "relative_key_query"])
def test_relative_schemes_agree_across_backends(case):
    io = load_file(V4 / case / "io.safetensors")
    inputs = {k: io[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    outs = []
    for backend in ("eager", "sdpa"):
        model = bertblocks.from_pretrained(V4 / case, attn_implementation=backend).eval()
        with torch.no_grad():
            outs.append(model(**inputs).last_hidden_state)
    assert_close(outs[1], outs[0])  # SDPA vs eager: different kernels


def test_relative_checkpoint_keeps_no_unused_position_table():
    model, info = bertblocks.from_pretrained(V4 / "relative_key", output_loading_info=True)
    assert not hasattr(model.embeddings, "position_embeddings")  # an unused parameter would break DDP
    assert info.ignored_keys == ["embeddings.position_embeddings.weight"]
    assert not info.unexpected_keys
    assert not info.missing_keys
    assert "encoder.layer.0.attention.self.distance_embedding.weight" in model.state_dict()


def test_pruned_checkpoint_rebuilds_smaller_layers():
    model = bertblocks.from_pretrained(V4 / "pruned")
    assert model.config.pruned_heads == {0: [0, 2], 1: [3]}
    assert model.encoder.layer[0].attention.num_heads == 2
    assert model.encoder.layer[1].attention.num_heads == 3
    assert model.encoder.layer[0].attention.self.query.weight.shape == (16, 32)


def test_pruning_equals_masking_the_same_heads():
    """Pruning heads gives what a zero head_mask on them gives (transformers 4 semantics)."""
    io = load_file(V4 / "absolute" / "io.safetensors")
    inputs = {k: io[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    model = bertblocks.from_pretrained(V4 / "absolute").eval()
    head_mask = torch.ones(2, 4)
    head_mask[0, [0, 2]] = 0
    head_mask[1, 3] = 0
    with torch.no_grad():
        masked = model(**inputs, head_mask=head_mask).last_hidden_state
        model.prune_heads({0: [0, 2], 1: [3]})
        pruned = model(**inputs).last_hidden_state
        # head_mask keeps numbering heads as before pruning
        pruned_masked = model(**inputs, head_mask=torch.ones(2, 4)).last_hidden_state
    assert_close(pruned, masked)  # smaller GEMMs: fp32 parity
    assert_identical(pruned_masked, pruned)  # a mask of ones multiplies by exactly 1.0 in the same kernels


def test_pruned_model_saves_and_reloads(tmp_path):
    model = bertblocks.from_pretrained(V4 / "pruned_relative_key").eval()
    model.save_pretrained(tmp_path)
    again = bertblocks.from_pretrained(tmp_path).eval()
    io = load_file(V4 / "pruned_relative_key" / "io.safetensors")
    inputs = {k: io[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        real = inputs["attention_mask"].bool()
        assert_close(again(**inputs)[0][real], io["last_hidden_state"][real])
