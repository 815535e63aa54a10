"""RoFormer (``roformer``), what only this family does: the stored sinusoidal table (its layout, its values read
from the checkpoint, long positions), the last-position multiple-choice summary (and why it is never packed on its
own), decoding through the cache, and what is refused. Parity of every head (and of a narrower ``embedding_size``
with ``rotary_value`` and ``relu``: the ``roformer-narrow`` row), the padded and packed paths, hidden states, the
tokenizer convention, the preset and the per-family paths: the tables of ``test_parity.py`` and
``test_family_paths.py``."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.plugins.positions import RotaryEmbedding, SinusoidalTable, sinusoidal_table
from tests.families.reference import FAMILIES, TOL, batch, save_hf

ROFORMER = FAMILIES["roformer"]


def test_the_table_is_roformers_own():
    from transformers.models.roformer.modeling_roformer import RoFormerSinusoidalPositionalEmbedding

    theirs = RoFormerSinusoidalPositionalEmbedding(300, 24).create_weight()
    assert torch.equal(sinusoidal_table(300, 24), theirs)


def test_the_stored_table_is_read_not_recomputed(tmp_path):
    """A checkpoint whose table differs from the formula gives transformers' numbers: both read the stored values."""
    save_hf(ROFORMER, "RoFormerModel", tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    key = "encoder.embed_positions.weight"
    state[key] = state[key] * 0.5  # still a table, another one
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    reference = transformers.RoFormerModel.from_pretrained(tmp_path).eval()
    ours = bertblocks.from_pretrained(tmp_path).eval()
    inputs, mask = batch(ROFORMER, "RoFormerModel")
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state[mask.bool()]
        got = ours(**inputs).last_hidden_state[mask.bool()]
    assert (expected - got).abs().max().item() <= TOL
    assert torch.equal(ours.encoder.embed_positions.weight, state[key])
    assert not ours.encoder.embed_positions.weight.requires_grad  # frozen, as transformers' is


def test_long_positions_match_transformers(tmp_path):
    """Up to the last row of the table; one token more is refused naming max_position_embeddings."""
    reference = save_hf(ROFORMER, "RoFormerModel", tmp_path, max_position_embeddings=1536)
    ids = torch.randint(3, 99, (1, 1536), generator=torch.Generator().manual_seed(2))
    ours = bertblocks.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = reference(input_ids=ids).last_hidden_state
        got = ours(input_ids=ids).last_hidden_state
    assert (expected - got).abs().max().item() <= TOL
    with pytest.raises(ValueError, match="max_position_embeddings=1536"):
        ours(input_ids=torch.ones(1, 1537, dtype=torch.long))


def test_multiple_choice_reads_the_last_position_padding_included(tmp_path):
    """transformers' RoFormerSequenceSummary takes position -1 of every choice, a padding position in the padded
    row: a head reading the last *real* token would differ there (round_trip compares the logits of both rows)."""
    save_hf(ROFORMER, "RoFormerForMultipleChoice", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    inputs, _ = batch(ROFORMER, "RoFormerForMultipleChoice")
    with torch.no_grad():
        logits = ours(**inputs).logits
        hidden = ours.bert(
            **{k: v.reshape(-1, v.shape[-1]) for k, v in inputs.items() if k != "labels"}
        ).last_hidden_state
        by_hand = ours.head.classifier(hidden[:, -1]).view(logits.shape)
    assert torch.equal(logits, by_hand)


def test_the_last_position_head_is_not_packed_automatically(tmp_path):
    """Packing leaves zeros at padded positions, and this head reads one: ``auto`` keeps the padded path even on a
    batch padded far past the threshold (transformers' numbers); ``always`` packs, and a padded choice then scores
    the zeros (the classifier's bias alone)."""
    reference = save_hf(ROFORMER, "RoFormerForMultipleChoice", tmp_path)
    inputs, _ = batch(ROFORMER, "RoFormerForMultipleChoice")
    inputs["attention_mask"][1, ..., 2:] = 0
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, ROFORMER.pad)
    assert (inputs["attention_mask"] == 0).float().mean() > 0.3  # above packing_threshold
    with torch.no_grad():
        expected = reference(**inputs).logits
        auto = bertblocks.from_pretrained(tmp_path, ["encoder.packing=auto"], head="auto").eval()
        assert (auto(**inputs).logits - expected).abs().max().item() <= TOL
        packed = bertblocks.from_pretrained(tmp_path, ["encoder.packing=always"], head="auto").eval()
        logits = packed(**inputs).logits
    assert (logits[0] - expected[0]).abs().max().item() <= TOL  # no padding: the same last position
    assert torch.equal(logits[1], packed.classifier.bias.expand(logits.shape[1]))


def test_the_rotation_reads_sines_then_cosines():
    """Stored rows [sin θ_0..θ_{r/2-1}, cos θ_0..]: the same rotation as the computed interleaved one."""
    table = SinusoidalTable(20, 8)
    stored = RotaryEmbedding(8, 10000.0, interleaved=True, table=table)
    computed = RotaryEmbedding(8, 10000.0, interleaved=True)
    q, k = torch.randn(2, 20, 3, 8, dtype=torch.float64), torch.randn(2, 20, 3, 8, dtype=torch.float64)
    table.weight.data = table.weight.data.double()
    positions = torch.arange(20)[None]
    for a, b in zip(stored(q, k, positions), computed(q, k, positions), strict=True):
        assert (a - b).abs().max().item() < 1e-6  # the table's float32 rounding; sines and cosines swapped: ~1


def test_a_stored_table_with_another_base_is_refused():
    from bertblocks.errors import BertBlocksError

    with pytest.raises(BertBlocksError, match="table: sinusoidal"):
        bertblocks.create_model("tiny-bert", ["position.name=rope", "position.table=sinusoidal", "position.base=500"])


@pytest.mark.parametrize("table", ["sinusoidal", "inv_freq"])
def test_ntk_scaling_of_a_stored_table_is_refused(table):
    """A stored table is used as stored: GTE's NTK scaling applies to computed frequencies only."""
    from bertblocks.errors import BertBlocksError

    with pytest.raises(BertBlocksError, match="ntk_factor 2 needs table: computed"):
        bertblocks.create_model("tiny-bert", ["position.name=rope", f"position.table={table}", "position.ntk_factor=2"])


def test_a_layer_cannot_override_the_one_stored_table():
    from bertblocks.errors import BertBlocksError

    with pytest.raises(BertBlocksError, match="keeps one table for the whole model"):
        bertblocks.create_model("tiny-roformer", ["encoder.overrides=[{layers: [1], position: {rotate_value: true}}]"])


def test_decoding_through_the_cache_gives_transformers_numbers(tmp_path):
    """RoFormerForCausalLM: a 5-token prefix, then one token at a time through bertblocks' KV cache, matches
    transformers' one pass (keys and rotated values are cached at their own positions of the stored table)."""
    reference = save_hf(ROFORMER, "RoFormerForCausalLM", tmp_path, rotary_value=True)
    ours = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    ids = torch.randint(3, 99, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        out = ours(input_ids=ids[:, :5], use_cache=True)
        steps = [out.logits]
        for t in range(5, 9):
            out = ours(input_ids=ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    assert (torch.cat(steps, dim=1) - expected).abs().max().item() <= TOL
