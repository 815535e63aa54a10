"""Nyströmformer (``nystromformer``), what only this family does: the landmark path (``num_landmarks !=
segment_means_seq_len``) against transformers at ``L == segment_means_seq_len`` for every class, padded (with the
``[b, 1, 1, L]`` padding mask transformers 4.x gave that path: 5.x fails there) and at other lengths; the pseudo-inverse
and its two starts; the ``nystrom`` attention as a component another family selects in YAML, through the conformance
suite with its option sets; packing each sequence alone; and what is refused. Parity of every head on the full path
(the published model's settings), hidden states and attention probabilities, presets and the per-family paths: the
``nystromformer`` row of ``tests/families/reference.py``."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.nystromformer import modeling_nystromformer

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.core.capabilities import CapabilityError
from bertblocks.errors import BertBlocksError
from bertblocks.plugins.nystrom import iterative_inverse
from bertblocks.registry import Registry
from bertblocks.testing import ConformanceSuite
from tests.families.reference import FAMILIES, TOL, assert_same, batch, call_inputs, save_hf

NYSTROMFORMER = FAMILIES["nystromformer"]
#: the landmark path at test size: 4 landmarks, segments of 3 over transformers' 12 positions
LANDMARKS = {"num_landmarks": 4, "segment_means_seq_len": 12, "conv_kernel_size": 3}
LENGTH = 12
CLASSES = NYSTROMFORMER.classes


def _inputs(cls: str, length: int = LENGTH, padded: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    family = type(NYSTROMFORMER)(
        **{**NYSTROMFORMER.__dict__, "length": length, "real": length - 4 if padded else length}
    )
    return batch(family, cls)


def _pair(tmp_path, cls: str, **settings: object) -> tuple[torch.nn.Module, torch.nn.Module]:
    reference = save_hf(NYSTROMFORMER, cls, tmp_path, **{**LANDMARKS, **settings})
    ours, info = bertblocks.from_pretrained(tmp_path, head="auto", output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    return reference, ours.eval()


# ------------------------------------------------------------------------------------------- landmark path
@pytest.mark.parametrize("cls", CLASSES)
def test_landmark_path_equals_transformers_at_segment_means_seq_len(tmp_path, cls):
    """Every class on the landmark path, unpadded (transformers 5.x's landmark path takes no padded batch), at
    transformers' one length, segment_means_seq_len."""
    reference, ours = _pair(tmp_path, cls)
    attention = ours.bert.encoder.layer_at(0).attention if hasattr(ours, "bert") else ours.encoder.layer_at(0).attention
    assert attention.landmarks
    assert attention.reads_padded_positions
    inputs, mask = _inputs(cls)
    inputs = call_inputs(cls, inputs)
    with torch.no_grad():
        assert_same(reference(**inputs), ours(**inputs), mask)


def _v4_padding_mask(config, inputs_embeds, attention_mask, **_: object) -> torch.Tensor:
    """transformers 4.x's ``get_extended_attention_mask``: ``[b, 1, 1, L]``, ``(1 - m) · finfo.min``, which the
    landmark kernel ``softmax(Q̃ Kᵀ + mask)`` broadcasts (5.x's ``[b, 1, L, L]`` does not)."""
    extended = attention_mask[:, None, None, :].to(inputs_embeds.dtype)
    return (1.0 - extended) * torch.finfo(inputs_embeds.dtype).min


@pytest.mark.parametrize("cls", ["NystromformerModel", "NystromformerForSequenceClassification"])
def test_landmark_path_on_a_padded_batch_masks_one_kernel_as_transformers(tmp_path, monkeypatch, cls):
    """Padded: the mask enters softmax(Q̃ Kᵀ) only; the landmarks average padded positions and the convolution reads
    their values, so real tokens depend on what padding holds: transformers' numbers, with 4.x's padding mask."""
    monkeypatch.setattr(modeling_nystromformer, "create_bidirectional_mask", _v4_padding_mask)
    reference, ours = _pair(tmp_path, cls)
    inputs, mask = _inputs(cls, padded=True)
    inputs = call_inputs(cls, inputs)
    with torch.no_grad():
        expected = reference(**inputs)
        assert_same(expected, ours(**inputs), mask)
        # other tokens at the padded positions: the outputs at real tokens change, in both
        other = {**inputs, "input_ids": inputs["input_ids"].masked_fill(mask == 0, 7)}
        changed = reference(**other)
        assert_same(changed, ours(**other), mask)
    field = "last_hidden_state" if cls.endswith("Model") else "logits"
    assert (getattr(expected, field) - getattr(changed, field)).abs().max() > 1e-3


def test_other_lengths_take_segments_of_that_length(tmp_path):
    """At a length other than segment_means_seq_len (a multiple of num_landmarks), the segments are L / m long: the
    numbers of transformers configured with segment_means_seq_len = L, on the same weights."""
    reference = save_hf(
        NYSTROMFORMER, "NystromformerModel", tmp_path / "hf", **{**LANDMARKS, "segment_means_seq_len": 8}
    )
    ours = bertblocks.from_pretrained(tmp_path / "hf", ["encoder.attention.segment_means_seq_len=12"]).eval()
    assert ours.config.encoder.attention.options()["segment_means_seq_len"] == 12
    inputs, mask = _inputs("NystromformerModel", length=8)
    inputs = call_inputs("NystromformerModel", inputs)
    with torch.no_grad():
        assert_same(reference(**inputs), ours(**inputs), mask)
        with pytest.raises(BertBlocksError, match="pad the batch to a multiple of 4"):
            ours(input_ids=inputs["input_ids"][:, :7])


def test_packed_landmark_path_computes_each_sequence_alone(tmp_path):
    """``packing: always`` on the landmark path: each sequence as transformers computes it alone (its own
    segments; configured with segment_means_seq_len = its length)."""
    save_hf(NYSTROMFORMER, "NystromformerModel", tmp_path / "ours", **LANDMARKS)
    packed = bertblocks.from_pretrained(tmp_path / "ours", ["encoder.packing=always"]).eval()
    assert "reads_padded_positions" in (packed.packing_off_reason or "")
    inputs, mask = _inputs("NystromformerModel", padded=True)  # rows of 12 and 8 tokens
    with torch.no_grad():
        got = packed(**call_inputs("NystromformerModel", inputs)).last_hidden_state
        for row, length in enumerate(mask.sum(1).tolist()):
            alone = save_hf(
                NYSTROMFORMER,
                "NystromformerModel",
                tmp_path / f"alone{row}",
                **{**LANDMARKS, "segment_means_seq_len": length},
            )
            one = {key: inputs[key][row : row + 1, :length] for key in ("input_ids", "token_type_ids")}
            want = alone(**one).last_hidden_state[0]
            assert (got[row, :length] - want).abs().max() <= TOL
        assert got[mask == 0].abs().max() == 0  # packed: zeros at padding


# --------------------------------------------------------------------------------------------- pseudo-inverse
def _softmax_rows(*shape: int) -> torch.Tensor:
    """Softmax rows with a dominant diagonal: well conditioned, as landmark kernels of distinct segments are."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(*shape, generator=g, dtype=torch.float64) * 0.5 + 3 * torch.eye(shape[-1], dtype=torch.float64)
    return torch.softmax(scores, dim=-1)


def test_iterative_inverse_approaches_the_pseudo_inverse_and_its_starts_differ_over_a_batch():
    matrices = _softmax_rows(2, 3, 4, 4)
    exact = torch.linalg.pinv(matrices)
    for exact_init in (False, True):
        approx = iterative_inverse(matrices, exact_init)
        assert (approx - exact).abs().max() < 1e-3 * exact.abs().max()
    # transformers' original start is one coefficient for the whole batch, the exact one per matrix: before the
    # iterations converge the two differ (so the option matters); on a single matrix they agree
    early = iterative_inverse(matrices, False, iterations=2) - iterative_inverse(matrices, True, iterations=2)
    assert early.abs().max() > 1e-6
    one = matrices[:1, :1]
    assert torch.equal(iterative_inverse(one, False), iterative_inverse(one, True))


def test_the_original_start_takes_the_largest_column_sum_of_the_batch():
    """Written out: Z0 = Aᵀ / max over the batch of A's column sums, then Z ← ¼ Z (13 I − AZ (15 I − AZ (7 I − AZ)))."""
    matrices = _softmax_rows(2, 2, 3, 3)
    z = matrices.transpose(-1, -2) / matrices.sum(-2).max()
    eye = torch.eye(3, dtype=torch.float64)
    for _ in range(6):
        az = matrices @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    assert torch.allclose(iterative_inverse(matrices, False), z, atol=1e-12)


# ------------------------------------------------------------------------------ the attention as a component
#: the attention's option sets (full path with its default 65-wide convolution is the suite's default run, in
#: tests/test_conformance.py): the landmark path with one landmark (every length of the suite's batches and of their
#: sequences alone is a multiple), with and without the convolution, and the full path without one
SUITES = {
    "landmarks": {"num_landmarks": 1, "segment_means_seq_len": 9, "conv_kernel_size": 3},
    "landmarks-no-conv": {"num_landmarks": 1, "segment_means_seq_len": 9, "conv_kernel_size": None},
    "full-no-conv": {"conv_kernel_size": None},
}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(*case.values, id=f"{label}-{case.id}", marks=case.marks)
        for label, options in SUITES.items()
        for case in ConformanceSuite(
            Registry(load_entry_points=False), options={("attention", "nystrom"): options}, compile_backend="aot_eager"
        ).params(kinds=["attention"], names=["nystrom"])
    ],
)
def test_option_sets_conform(case):
    case.run()


def test_without_convolution_the_full_path_reads_no_padding():
    config = bertblocks.load_config(
        "tiny-bert", {"encoder.attention.name": "nystrom", "encoder.attention.conv_kernel_size": None}
    )
    model = bertblocks.create_model(config)
    assert model.packing_off_reason is None
    landmarks = bertblocks.create_model(
        bertblocks.load_config("tiny-nystromformer", {"encoder.attention.conv_kernel_size": None})
    )
    assert "reads_padded_positions" in (landmarks.packing_off_reason or "")


def test_another_family_uses_the_attention_from_yaml(tmp_path):
    """A BERT config with ``encoder.attention.name: nystrom`` on the landmark path: built, saved (the choice travels
    in config.json's ``bertblocks`` block) and loaded back with the same outputs."""
    config = bertblocks.load_config(
        "tiny-bert",
        {
            "encoder.attention.name": "nystrom",
            "encoder.attention.num_landmarks": 4,
            "encoder.attention.segment_means_seq_len": 8,
        },
    )
    torch.manual_seed(0)
    model = bertblocks.create_model(config).eval()
    assert type(model.encoder.layer_at(0).attention).__name__ == "NystromAttention"
    ids = torch.randint(5, 99, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    model.save_pretrained(tmp_path)
    again = bertblocks.from_pretrained(tmp_path).eval()
    assert again.config.encoder.attention.name == "nystrom"
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids, attention_mask=mask).last_hidden_state, out)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"position": "rope"}, "takes no position terms"),
        ({"position": "relative_key"}, "takes no position terms"),
        ({"is_decoder": True}, "is an encoder's"),
        ({"encoder.attention.conv_kernel_size": 4}, "conv_kernel_size 4 must be odd"),
    ],
)
def test_refused_at_validate(overrides, message):
    with pytest.raises(ConfigError, match=message):
        bertblocks.load_config("tiny-nystromformer", overrides)


def test_landmark_path_refuses_attention_weights_and_pruning():
    model = bertblocks.create_model(bertblocks.load_config("tiny-nystromformer")).eval()
    ids = torch.randint(5, 99, (1, 16))
    with pytest.raises(CapabilityError, match="landmark path has no"):
        model(input_ids=ids, output_attentions=True)
    with pytest.raises(CapabilityError, match="not pruned"):
        model.prune_heads({0: [1]})


def test_positions_start_at_two_and_the_table_says_how_many_tokens_fit(tmp_path):
    """transformers' ids are arange(L) + 2 into max_position_embeddings + 2 rows: 510 tokens for the published model,
    64 here; one more is refused naming the limit (transformers fails inside its embedding)."""
    reference = save_hf(NYSTROMFORMER, "NystromformerModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    assert ours.config.max_position_embeddings == NYSTROMFORMER.settings["max_position_embeddings"] + 2
    ids = torch.randint(5, 99, (1, 64))
    with torch.no_grad():
        assert (reference(input_ids=ids).last_hidden_state - ours(input_ids=ids).last_hidden_state).abs().max() <= TOL
    with pytest.raises(BertBlocksError, match="at most 64 tokens"):
        ours(input_ids=torch.randint(5, 99, (1, 65)))


def test_published_config_translates_to_the_preset():
    published = transformers.NystromformerConfig().to_dict()  # its defaults are uw-madison/nystromformer-512's
    config = bertblocks.load_config({**published, "architectures": ["NystromformerForMaskedLM"]})
    preset = bertblocks.load_config("nystromformer-512")
    assert config.encoder.attention == preset.encoder.attention
    assert (config.hidden_size, config.max_position_embeddings, config.vocab_size) == (768, 512, 30000)
